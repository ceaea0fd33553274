package livelab

import (
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/agent"
	"sluice/entitle"
	"sluice/lab"
	"sluice/policy"
)

// What VMs receive (issue 27): the flows run the other way (iperf3 -R
// from the VM: the fabric's server sends), the classes that shape them
// are those of the inbound tree on the uplink's IFB, and the receiving
// sockets are in the VMs.

// WatchInbound starts a ClassWatch of the ports of the inbound tree of
// host's first uplink (on its IFB); cleanup stops it.
func WatchInbound(t testing.TB, plan *lab.Plan, p *policy.Policy, host string, ports []string) *ClassWatch {
	t.Helper()
	inv, err := plan.Inventory(host)
	if err != nil {
		t.Fatal(err)
	}
	var in []entitle.UplinkSpec
	for _, u := range entitle.Derive(p, entitle.Live{}).Inbound {
		if u.Host == host {
			in = append(in, u)
		}
	}
	trees, err := agent.Build(in, inv)
	if err != nil {
		t.Fatal(err)
	}
	if len(trees) == 0 {
		t.Fatalf("watch: host %s has no inbound tree", host)
	}
	return watchTree(t, plan, host, trees, ports)
}

// WatchVMReceivers samples the receiving sockets in the namespaces of
// the VMs vms (the clients of reversed iperf3 runs), keyed by their
// peer's port: the fabric's iperf3 server port of the vNIC.
func WatchVMReceivers(t testing.TB, plan *lab.Plan, vms []string) *Receivers {
	t.Helper()
	var hs []*netlink.Handle
	for _, vm := range vms {
		v := plan.VM(vm)
		if v == nil {
			t.Fatalf("no VM %s in the lab", vm)
		}
		ns, err := netns.GetFromName(v.Name)
		if err != nil {
			t.Fatalf("namespace of %s: %v", vm, err)
		}
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
		ns.Close()
		if err != nil {
			t.Fatalf("sock_diag in %s: %v", vm, err)
		}
		hs = append(hs, h)
	}
	return watchReceivers(t, hs, ClientSide)
}

// InboundEntitlements is Entitlements for what host's first uplink
// receives: alloc on its inbound tree with usable as its capacity and
// unbounded demand for the active ports.
func InboundEntitlements(p *policy.Policy, host string, usable float64, active ...string) map[string]float64 {
	var u *entitle.UplinkSpec
	d := entitle.Derive(p, entitle.Live{})
	for i := range d.Inbound {
		if d.Inbound[i].Host == host {
			u = &d.Inbound[i]
			break
		}
	}
	if u == nil {
		return nil
	}
	spec := *u
	spec.UsableBps = usable
	return entitlementsOf(&entitle.Desired{Inbound: []entitle.UplinkSpec{spec}}, true, active)
}
