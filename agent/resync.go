package agent

import (
	"errors"
	"fmt"
	"slices"

	"sluice/entitle"
	"sluice/policy"
)

// ChangeNotifier is an Inventory that signals when what runs on the host
// changes (a domain started, stopped, migrated); Run re-derives on each
// signal. The libvirt inventory (package virt) is one.
type ChangeNotifier interface {
	Changes() <-chan struct{}
}

// PolicyNamer is an Inventory that must know how the policy names VMs
// (package virt matches domain names and UUIDs); the agent tells it on
// New and on each SetPolicy.
type PolicyNamer interface {
	SetPolicyVMs(names []string)
}

// UnnamedLister is an Inventory that knows the running VMs the policy
// does not name, with their vNICs. The derivation gives each such vNIC a
// class of its own with the policy's unnamedVMs setting (entitle.Live's
// Unnamed); its port is VM/NIC with the names given here, which VNIC
// resolves. The statistics list the VMs (Stats.Unnamed).
type UnnamedLister interface {
	UnnamedVMs() []UnnamedVM
}

// UnnamedVM is a running VM that the policy does not name, and the names
// of its vNICs (those with a host-side device the agent can classify at).
type UnnamedVM struct {
	Name string
	NICs []string
}

func tellPolicyVMs(inv Inventory, p *policy.Policy) {
	n, ok := inv.(PolicyNamer)
	if !ok {
		return
	}
	names := make([]string, 0, len(p.VMs))
	for _, vm := range p.VMs {
		names = append(names, vm.Name)
	}
	n.SetPolicyVMs(names)
}

// derive builds the trees of p for the VMs the inventory says run on the
// host now.
func derive(p *policy.Policy, host string, inv Inventory, ports map[string][]PortRange) ([]*Tree, error) {
	if p.Host(host) == nil {
		return nil, fmt.Errorf("host %q is not in the policy", host)
	}
	vms, err := inv.VMs()
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	live := entitle.Live{Hosts: map[string]string{}}
	for _, vm := range vms {
		live.Hosts[vm] = host
	}
	if u, ok := inv.(UnnamedLister); ok {
		for _, vm := range u.UnnamedVMs() {
			live.Unnamed = append(live.Unnamed, entitle.UnnamedVM{Name: vm.Name, Host: host, NICs: vm.NICs})
		}
	}
	if ports == nil {
		ports = DefaultClassPorts
	}
	d := entitle.Derive(p, live)
	trees, err := build(d.HostUplinks(host), inv, ports)
	if err != nil {
		return nil, err
	}
	// Inbound trees only where some vNIC or class has an ingress setting.
	var in []entitle.UplinkSpec
	for _, u := range d.Inbound {
		if u.Host == host && inboundUsed(&u) {
			in = append(in, u)
		}
	}
	inTrees, err := build(in, inv, ports)
	if err != nil {
		return nil, err
	}
	return append(trees, inTrees...), nil
}

// inboundUsed says the inbound tree u shapes something: a vNIC or a class
// has an ingress setting on it.
func inboundUsed(u *entitle.UplinkSpec) bool {
	if u.HasVNICs() {
		return true
	}
	for _, c := range u.Classes {
		if c.Declared {
			return true
		}
	}
	return false
}

// Resync derives the trees again from the agent's policy and what the
// inventory says runs on the host now. The next Step reconciles the
// kernel to them: classes of vNICs that left are deleted, new ones are
// created, and every port that remains keeps its measured history (its
// rate, its demand window), so that the traffic of VMs that keep running
// is not disturbed. On an error the trees are left as they were.
func (a *Agent) Resync() error {
	trees, err := derive(a.cfg.Policy, a.cfg.Host, a.cfg.Inventory, a.cfg.ClassPorts)
	if err != nil {
		return err
	}
	cpu, err := deriveCPU(a.cfg.Policy, a.cfg.Host, a.cfg.Inventory, a.cpuByName())
	if err != nil {
		return err
	}
	a.setTrees(trees)
	a.setCPU(cpu)
	return nil
}

// SetPolicy makes p the agent's policy and re-derives the trees (Resync).
// A policy that does not name the agent's host, or whose trees cannot be
// built (an uplink without a device), is refused and the agent keeps the
// policy it had.
func (a *Agent) SetPolicy(p *policy.Policy) error {
	if p == nil {
		return fmt.Errorf("agent: no policy")
	}
	if p.Cluster != a.cfg.Policy.Cluster {
		return fmt.Errorf("policy is of cluster %q, the agent's is %q (restart the agent to change cluster)", p.Cluster, a.cfg.Policy.Cluster)
	}
	old := a.cfg.Policy
	tellPolicyVMs(a.cfg.Inventory, p)
	trees, err := derive(p, a.cfg.Host, a.cfg.Inventory, a.cfg.ClassPorts)
	var cpu []*cpuVM
	if err == nil {
		cpu, err = deriveCPU(p, a.cfg.Host, a.cfg.Inventory, a.cpuByName())
	}
	if err != nil {
		tellPolicyVMs(a.cfg.Inventory, old)
		return err
	}
	a.cfg.Policy = p
	a.setTrees(trees)
	a.setCPU(cpu)
	return nil
}

// Policy returns the policy the agent enforces.
func (a *Agent) Policy() *policy.Policy { return a.cfg.Policy }

// setTrees installs new trees and forgets the history of ports that are
// on none of them; the next Measure reads the uplinks' NICs again.
func (a *Agent) setTrees(trees []*Tree) {
	keep := map[string]bool{}
	for _, t := range trees {
		for _, n := range t.Nodes {
			keep[t.Dev+"|"+n.Name] = true
		}
	}
	for k := range a.ports {
		if !keep[k] {
			delete(a.ports, k)
		}
	}
	devs := map[string]bool{}
	for _, t := range trees {
		devs[t.Dev] = true
	}
	for _, t := range a.trees {
		if !devs[t.Dev] && !slices.Contains(a.released, t.Dev) {
			a.released = append(a.released, t.Dev)
		}
	}
	a.trees = trees
	a.nicStale = true // an uplink may be new, or changed with the host
}

// unnamed lists the running VMs the policy does not name, when the
// inventory knows them.
func (a *Agent) unnamed() []string {
	u, ok := a.cfg.Inventory.(UnnamedLister)
	if !ok {
		return nil
	}
	var out []string
	for _, vm := range u.UnnamedVMs() {
		out = append(out, vm.Name)
	}
	return out
}

// releaseUplinks gives back the recorded root qdisc of the uplinks that a
// new policy no longer names (when sluice's HTB is still there).
func (a *Agent) releaseUplinks(ch *Changes) error {
	var errs []error
	var keep []string
	for _, dev := range a.released {
		if a.onTree(dev) {
			continue // named again
		}
		if uplink, ok := a.rec.Ingress[dev]; ok {
			if err := a.releaseIngress(dev, uplink); err != nil {
				errs = append(errs, err)
				keep = append(keep, dev)
				continue
			}
			ch.Qdisc++
			delete(a.taken, dev)
			errs = append(errs, a.saveRecord())
			continue
		}
		q, ok := a.rec.Uplinks[dev]
		if !ok {
			q = Qdisc{Kind: "noqueue", Handle: "0:0", Default: true}
		}
		cur, err := a.cfg.Kernel.RootQdisc(dev)
		if err == nil && cur.IsSluice() {
			if err := a.cfg.Kernel.RestoreRoot(dev, q); err != nil {
				errs = append(errs, fmt.Errorf("restoring the root qdisc of %s: %w", dev, err))
				keep = append(keep, dev)
				continue
			}
			ch.Qdisc++
			errs = append(errs, removeRootRecord(a.cfg.RootsDir, cur))
		}
		delete(a.rec.Uplinks, dev)
		delete(a.taken, dev)
		errs = append(errs, a.saveRecord())
	}
	a.released = keep
	return errors.Join(errs...)
}

func (a *Agent) onTree(dev string) bool {
	for _, t := range a.trees {
		if t.Dev == dev {
			return true
		}
	}
	return false
}
