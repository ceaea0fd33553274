package controller

import (
	"net/http"
	"strings"
	"testing"
)

func newDRSFixture(t *testing.T, mode DRSMode, threshold int) *fixture {
	t.Helper()
	f := newFixture(t, true)
	f.c.cfg.DRS, f.c.cfg.RebalanceThreshold = mode, threshold
	return f
}

func kinds(r Result) string {
	var ks []string
	for _, e := range r.Events {
		ks = append(ks, e.Kind)
	}
	return strings.Join(ks, " ")
}

func (f *fixture) set(change string) Result {
	f.t.Helper()
	r, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{change}})
	if err != nil {
		f.t.Fatalf("set %s: %v", change, err)
	}
	return r
}

// TestDRSManual: step b's fault is recommended; approving the decision
// moves vm2's placement (both hosts' desired states), the destination's
// report finishes it, and it cannot be approved twice.
func TestDRSManual(t *testing.T) {
	f := newDRSFixture(t, DRSManual, 1)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	l, err := f.cl.Register(f.ctx, "h2", Report{VMs: []string{}, Uplinks: []string{"vmnic0"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := f.set("vm2/nic0.reservation=4.5Gbps"); kinds(r) != "set fault recommend" {
		t.Fatalf("step b: %s", kinds(r))
	}
	ds, _ := f.cl.Decisions(f.ctx)
	if len(ds) != 1 || ds[0].Status != "recommended" || f.vm("vm2").Host != "h1" {
		t.Fatalf("decisions %+v, vm2 on %s", ds, f.vm("vm2").Host)
	}
	seq := ds[0].Seq
	if _, err := f.cl.Approve(f.ctx, seq+1000, ""); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("approve of no decision: %v", err)
	}
	r, err := f.cl.Approve(f.ctx, seq, "ok by ops")
	if err != nil || kinds(r) != "migrate" || r.Events[0].Reason != "ok by ops" {
		t.Fatalf("approve: %+v %v", r, err)
	}
	d2, _ := f.cl.WatchDesired(f.ctx, "h2", 0, 0)
	if f.vm("vm2").Host != "h2" || jsonOf(d2.VMs) != jsonOf([]string{"vm2"}) || len(d2.Uplinks[0].Classes) == 0 {
		t.Fatalf("vm2 on %s, desired of h2 %+v", f.vm("vm2").Host, d2)
	}
	if _, err := f.cl.Approve(f.ctx, seq, ""); StatusOf(err) != http.StatusConflict {
		t.Fatalf("second approve: %v", err)
	}
	// The destination's agent reports vm2: the decision is done.
	if err := f.cl.Report(f.ctx, "h2", l.ID, Report{VMs: []string{"vm2"}, Uplinks: []string{"vmnic0"}}); err != nil {
		t.Fatal(err)
	}
	ds, _ = f.cl.Decisions(f.ctx)
	evs, _ := f.cl.Events(f.ctx, 0)
	if ds[0].Status != "done" || evs[len(evs)-1].Kind != "migrated" {
		t.Fatalf("after the report: %+v, last event %+v", ds, evs[len(evs)-1])
	}
}

// TestDRSStale: a recommendation whose VM was moved another way is
// superseded when approved.
func TestDRSStale(t *testing.T) {
	f := newDRSFixture(t, DRSManual, 1)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	f.set("vm2/nic0.reservation=4.5Gbps")
	if _, err := f.cl.Migrate(f.ctx, "vm2", MigrateRequest{To: "h2"}); err != nil {
		t.Fatal(err)
	}
	ds, _ := f.cl.Decisions(f.ctx)
	if _, err := f.cl.Approve(f.ctx, ds[0].Seq, ""); StatusOf(err) != http.StatusConflict {
		t.Fatalf("approve of a stale decision: %v", err)
	}
	ds, _ = f.cl.Decisions(f.ctx)
	if ds[0].Status != "superseded" || ds[1].Status != "moving" {
		t.Fatalf("decisions %+v", ds)
	}
}

// TestDRSAutomatic: Fig. 2 steps b and c move vm2, then vm3, to h2 by
// themselves; passes after them (also rebalancing at threshold 5) move
// nothing back (no ping-pong).
func TestDRSAutomatic(t *testing.T) {
	f := newDRSFixture(t, DRSAutomatic, 5)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	f.set("vm1/nic0.reservation=7.5Gbps")
	if r := f.set("vm2/nic0.reservation=4.5Gbps"); kinds(r) != "set fault migrate" || f.vm("vm2").Host != "h2" {
		t.Fatalf("step b: %s, vm2 on %s", kinds(r), f.vm("vm2").Host)
	}
	if r := f.set("vm3/nic0.reservation=3Gbps"); kinds(r) != "set fault migrate" || f.vm("vm3").Host != "h2" {
		t.Fatalf("step c: %s, vm3 on %s", kinds(r), f.vm("vm3").Host)
	}
	if v := f.vm("vm1"); v.Host != "h1" || v.NICs[0].AllocBps != 9.4e9 {
		t.Fatalf("vm1 %+v", v)
	}
	for i := 0; i < 3; i++ {
		r, err := f.c.DRSPass(f.ctx)
		if err != nil || len(r.Events) != 0 {
			t.Fatalf("pass %d: %+v %v", i, r, err)
		}
	}
	ds, _ := f.cl.Decisions(f.ctx)
	if len(ds) != 2 || ds[0].Status != "moving" || ds[1].VM != "vm3" {
		t.Fatalf("decisions %+v", ds)
	}
	if h := f.c.history["vm3"]; h.From != "h1" || h.To != "h2" {
		t.Fatalf("history %+v", f.c.history)
	}
}

// TestDRSPassRepairs: a fault recommended in manual mode is recommended
// only once by the periodic pass; switched to automatic, the pass carries
// it out.
func TestDRSPassRepairs(t *testing.T) {
	f := newDRSFixture(t, DRSManual, 1)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	f.set("vm2/nic0.reservation=4.5Gbps")
	if r, err := f.c.DRSPass(f.ctx); err != nil || len(r.Events) != 0 {
		t.Fatalf("manual pass: %+v %v", r, err)
	}
	f.c.cfg.DRS = DRSAutomatic
	if r, err := f.c.DRSPass(f.ctx); err != nil || kinds(r) != "migrate" || f.vm("vm2").Host != "h2" {
		t.Fatalf("automatic pass: %+v %v", r, err)
	}
	if r, _ := f.c.DRSPass(f.ctx); len(r.Events) != 0 {
		t.Fatalf("second pass: %+v", r)
	}
	if _, err := ParseDRSMode("sometimes"); err == nil {
		t.Fatal("bad mode accepted")
	}
}
