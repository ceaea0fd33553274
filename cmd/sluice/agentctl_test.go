package main

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/controller"
	"sluice/lab"
	"sluice/policy"
)

// TestAgentSideExecutor: VMs new in the desired state are moved in by
// the executor (a fake here), one it cannot move stays out and is
// reported to the controller (Report.Failed), not returned: the agent
// goes on; VMs gone are let go; the vNICs of running VMs only are known;
// the policy reaches the agent's channel; the report carries the measured
// rates.
func TestAgentSideExecutor(t *testing.T) {
	b, err := os.ReadFile("../../examples/netioc-fig2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("fig2.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	policies := make(chan *policy.Policy, 1)
	var src inventoryFlags
	src.kind = "lab"
	pl, _ := lab.NewPlan(p)
	base, _ := pl.Inventory("h2")
	s, inv, err := newAgentSide(&src, &migrateFlags{}, pl, "h2", base, policies)
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	s.mover = func(vm string) error {
		if vm == "vm3" {
			return errors.New("veth busy")
		}
		moved = append(moved, vm)
		return nil
	}
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
	s.setStats(agent.Stats{Uplinks: []agent.UplinkStat{{Uplink: "vmnic0", Ports: []agent.PortStat{{Port: "vm2/nic0", RateBps: 4e8}}}}})
	if r := s.Report(); r.RatesBps["vm2/nic0"] != 4e8 || !slices.Equal(r.Uplinks, []string{"vmnic0"}) {
		t.Fatalf("report %+v", r)
	}
	// A closed agent: Apply returns instead of blocking.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.ctx = ctx
	if err := s.Apply(controller.DesiredHost{Host: "h2", Policy: p}); err == nil {
		t.Fatal("apply with the agent gone: no error")
	}
}

func TestAgentControllerUsage(t *testing.T) {
	for _, args := range [][]string{
		{"agent", "--host", "h1"},
		{"agent", "--host", "h1", "--policy", "x.yaml", "--controller", "https://127.0.0.1:1"},
	} {
		var out, errb strings.Builder
		if code := run(args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d %q", args, code, errb.String())
		}
	}
	var out, errb strings.Builder
	if code := run([]string{"agent", "--host", "h1", "--controller", "https://127.0.0.1:1"}, &out, &errb); code != exitBad || !strings.Contains(errb.String(), "--token-file") {
		t.Errorf("no token: exit %d %q", code, errb.String())
	}
}
