package hostside

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"sluice/agent"
	"sluice/controller"
	"sluice/lab"
	"sluice/policy"
)

// TestSideExecutor: VMs new in the desired state are moved in by
// the executor (a fake here), one it cannot move stays out and is
// reported to the controller (Report.Failed), not returned: the agent
// goes on; VMs gone are let go; the vNICs of running VMs only are known;
// the policy reaches the agent's channel; the report carries the measured
// rates.
func TestSideExecutor(t *testing.T) {
	b, err := os.ReadFile("../examples/netioc-fig2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("fig2.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	policies := make(chan *policy.Policy, 1)
	pl, _ := lab.NewPlan(p)
	inv, err := NewLabInventory(pl, "h2")
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	s := New(Config{Lab: inv, Policies: policies, Mover: func(vm string) error {
		if vm == "vm3" {
			return errors.New("veth busy")
		}
		moved = append(moved, vm)
		return nil
	}})
	err = s.Apply(controller.DesiredHost{Host: "h2", VMs: []string{"vm2", "vm3"}, Policy: p})
	if err != nil || !slices.Equal(moved, []string{"vm2"}) {
		t.Fatalf("apply: %v, moved %v", err, moved)
	}
	if got := <-policies; got != p {
		t.Fatal("the policy did not reach the agent")
	}
	select {
	case <-s.Changed():
	default:
		t.Fatal("a failed move and a new VM: no report asked for")
	}
	if r := s.Report(); r.Failed["vm3"] != "veth busy" || !slices.Equal(r.VMs, []string{"vm2"}) || r.Since["vm2"].IsZero() {
		t.Fatalf("report after a failed move: %+v", r)
	}
	if vms, _ := inv.VMs(); !slices.Equal(vms, []string{"vm2"}) {
		t.Fatalf("running %v", vms)
	}
	if _, ok := inv.VNIC("vm2/nic0"); !ok {
		t.Fatal("vm2/nic0 unknown after its move")
	}
	if _, ok := inv.VNIC("vm1/nic0"); ok {
		t.Fatal("vm1/nic0 known on h2")
	}
	// vm2 leaves again: let go without the executor.
	if err := s.Apply(controller.DesiredHost{Host: "h2", VMs: []string{}, Policy: p}); err != nil {
		t.Fatal(err)
	}
	<-policies
	if vms, _ := inv.VMs(); len(vms) != 0 || len(moved) != 1 {
		t.Fatalf("running %v, moved %v", vms, moved)
	}
	s.SetStats(agent.Stats{Uplinks: []agent.UplinkStat{{Uplink: "vmnic0", Ports: []agent.PortStat{{Port: "vm2/nic0", RateBps: 4e8}}}}})
	if r := s.Report(); r.RatesBps["vm2/nic0"] != 4e8 || !slices.Equal(r.Uplinks, []string{"vmnic0"}) || r.CapacityIOPS != nil {
		t.Fatalf("report %+v", r)
	}
	// The throttle driver's measured capacities go into the report.
	s.SetCapacities(func() map[string]float64 { return map[string]float64{"nfs1": 480} })
	if r := s.Report(); r.CapacityIOPS["nfs1"] != 480 || len(r.CapacityIOPS) != 1 {
		t.Fatalf("report's capacities %v, want nfs1: 480", r.CapacityIOPS)
	}
	// A closed agent: Apply returns instead of blocking.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Attach(ctx, nil)
	if err := s.Apply(controller.DesiredHost{Host: "h2", Policy: p}); err == nil {
		t.Fatal("apply with the agent gone: no error")
	}
}

// TestSideMigratesIn: on a libvirt host (no movable inventory) the
// VMs the desired state moves here (Moves) that libvirt does not run are
// migrated in by the mover; one that fails is reported (Report.Failed)
// with the mover's reason; VMs placed here that run nowhere (off) are not
// moved: nothing is an error the agent stops on.
func TestSideMigratesIn(t *testing.T) {
	var moved []string
	cfg := Config{VMs: func() []string { return []string{"vm1"} }, Mover: func(vm string) error {
		moved = append(moved, vm)
		if vm == "vm3" {
			return errors.New("peer h1: connection refused")
		}
		return nil
	}}
	s := New(cfg)
	err := s.Arrive(controller.DesiredHost{Host: "h2", VMs: []string{"vm1", "vm2", "vm3", "vm4"},
		Moves: []controller.Move{{VM: "vm2", From: "h1"}, {VM: "vm3", From: "h1"}}})
	if err == nil || err.Error() != "moving vm3 in from h1: peer h1: connection refused" || !slices.Equal(moved, []string{"vm2", "vm3"}) {
		t.Errorf("arrive: %v, moved %v (vm4 is off: not moved)", err, moved)
	}
	if r := s.Report(); len(r.Failed) != 1 || r.Failed["vm3"] != "peer h1: connection refused" {
		t.Errorf("failed moves reported: %+v", r.Failed)
	}
	cfg.Mover = nil
	s = New(cfg)
	if err := s.Arrive(controller.DesiredHost{VMs: []string{"vm2"}, Moves: []controller.Move{{VM: "vm2", From: "h1"}}}); err == nil || err.Error() != "moving vm2 in from h1: no executor for this inventory" {
		t.Errorf("no mover: %v", err)
	}
	// The move is no longer asked (the controller recorded it failed):
	// nothing is reported failed any more.
	if err := s.Arrive(controller.DesiredHost{VMs: []string{"vm1"}}); err != nil || len(s.Report().Failed) != 0 {
		t.Errorf("no move asked: %v, failed %v", err, s.Report().Failed)
	}
}
