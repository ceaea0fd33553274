package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"

	"sluice/agent"
	"sluice/lab"
	"sluice/policy"
	"sluice/virt"
)

// policyPollNs is how often the agent looks at its policy file's content
// (policyfile.Watch); a change is taken after two polls (within 1 s).
const policyPollNs = int64(250e6)

// inventoryFlags choose where the agent learns what runs on its host:
// the lab's plan (namespace VMs) or libvirt.
type inventoryFlags struct {
	kind    string
	uplinks virt.Uplinks
	socket  string
	labDir  string
}

func (f *inventoryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kind, "inventory", "lab", "where the agent learns the host's VMs: lab (the lab's namespace VMs) or libvirt")
	fs.Var(&f.uplinks, "uplink", "NAME=DEVICE: the host device of the policy's uplink NAME (libvirt inventory; repeated)")
	fs.StringVar(&f.socket, "libvirt-socket", virt.DefaultSocket, "libvirtd's socket (libvirt inventory)")
	fs.StringVar(&f.labDir, "lab-state-dir", "", "DIR where sluice lab up recorded the lab (its --state-dir; default: the agent's --state-dir), read by an agent that follows a controller on a lab host")
}

func (f *inventoryFlags) valid() bool { return f.kind == "lab" || f.kind == "libvirt" }

// netns is the namespace the agent works in: a libvirt host's taps and
// uplinks are in the agent's own namespace unless --netns says otherwise.
func (f *inventoryFlags) netns(flagNS, cluster, host string) string {
	if f.kind == "libvirt" {
		return flagNS
	}
	return agentNetns(flagNS, cluster, host)
}

// labPlan is the plan of the lab the agent's host is in: the plan of its
// policy file, or, for an agent that follows a controller (which sends the
// host only its part of the policy), the plan the lab was built from (its
// state file under --lab-state-dir, else stateDir). Nil for a libvirt
// inventory.
func (f *inventoryFlags) labPlan(p *policy.Policy, stateDir string, followsController bool) (*lab.Plan, error) {
	switch {
	case f.kind != "lab":
		return nil, nil
	case followsController && f.labDir != "":
		return lab.PlanOf(f.labDir, p.Cluster)
	case followsController:
		return lab.PlanOf(stateDir, p.Cluster)
	}
	return lab.NewPlan(p)
}

// open builds the inventory: of the lab's plan pl, or of libvirt. The
// libvirt one has read every running domain when it returns (warn gets
// those it could not read); master tells
// the bridge of an uplink device (in the agent's namespace), for the
// domains the policy does not name.
func (f *inventoryFlags) open(p *policy.Policy, pl *lab.Plan, host string, master func(dev string) (string, error), warn func(error)) (agent.Inventory, func(), error) {
	if f.kind == "lab" {
		inv, err := pl.Inventory(host)
		if err != nil {
			return nil, nil, err
		}
		return inv, func() {}, nil
	}
	for _, u := range p.Host(host).Uplinks {
		if _, ok := f.uplinks[u.Name]; !ok {
			return nil, nil, fmt.Errorf("uplink %s of host %s has no device: give --uplink %s=DEVICE", u.Name, host, u.Name)
		}
	}
	conn, err := virt.Dial(f.socket)
	if err != nil {
		return nil, nil, err
	}
	inv := virt.New(conn, virt.Config{Uplinks: f.uplinks, Cgroup: virt.ProcCgroup, Master: master})
	var de *virt.DomainsError
	if err := inv.Refresh(); errors.As(err, &de) {
		// A domain that cannot be read is reported; the others are
		// enforced (a lifecycle event of it reads it again).
		warn(err)
	} else if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return inv, func() { conn.Close() }, nil
}

// follow keeps a libvirt inventory current from libvirt's events until ctx
// ends. When the event stream is lost it calls stop (the agent exits; a
// restarted agent reconnects and resumes without disturbing traffic); the
// returned function gives that error.
func (f *inventoryFlags) follow(ctx context.Context, inv agent.Inventory, stop func()) func() error {
	vi, ok := inv.(*virt.Inventory)
	if !ok {
		return func() error { return nil }
	}
	var mu sync.Mutex
	var runErr error
	go func() {
		err := vi.Run(ctx)
		if err != nil {
			mu.Lock()
			runErr = fmt.Errorf("libvirt inventory: %w", err)
			mu.Unlock()
			stop()
		}
	}()
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		return runErr
	}
}

// devices are the uplink and vNIC devices the inventory knows, for
// uninstall when the state file is lost.
func (f *inventoryFlags) devices(p *policy.Policy, host string) (uplinks, vnics []string) {
	if f.kind == "libvirt" {
		for _, d := range f.uplinks {
			uplinks = append(uplinks, d)
		}
		conn, err := virt.Dial(f.socket)
		if err != nil {
			return uplinks, nil // the state file's vNICs still are cleaned
		}
		defer conn.Close()
		inv := virt.New(conn, virt.Config{Uplinks: f.uplinks})
		_ = inv.Refresh()
		for _, d := range inv.Domains() {
			for _, i := range d.Interfaces {
				if i.Dev != "" {
					vnics = append(vnics, i.Dev)
				}
			}
		}
		return uplinks, vnics
	}
	if pl, err := lab.NewPlan(p); err == nil {
		if inv, err := pl.Inventory(host); err == nil {
			for _, d := range inv.Devices {
				uplinks = append(uplinks, d)
			}
			for _, m := range inv.VNICs {
				vnics = append(vnics, m.HostDev)
			}
		}
	}
	return uplinks, vnics
}
