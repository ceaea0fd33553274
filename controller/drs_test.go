package controller

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
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
	if h, err := f.c.History(f.ctx); err != nil || h["vm3"].From != "h1" || h["vm3"].To != "h2" || h["vm2"].To != "h2" {
		t.Fatalf("history %+v %v", h, err)
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

// TestDRSHistoryRestart: the history of migrations is in etcd with the
// placement: a new controller on the same prefix (a restart, also after
// kill -9) reads it back, and its passes neither repeat the moves nor
// undo them, also rebalancing at threshold 5.
func TestDRSHistoryRestart(t *testing.T) {
	f := newDRSFixture(t, DRSAutomatic, 5)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	f.set("vm1/nic0.reservation=7.5Gbps")
	f.set("vm2/nic0.reservation=4.5Gbps")
	before, err := f.c.History(f.ctx)
	if err != nil || before["vm2"].To != "h2" || before["vm2"].AtNs == 0 {
		t.Fatalf("history %+v %v", before, err)
	}
	c2 := New(Config{Client: testEtcd.Client, Prefix: f.c.cfg.Prefix, ChooseHosts: true, DRS: DRSAutomatic, RebalanceThreshold: 5})
	after, err := c2.History(f.ctx)
	if err != nil || jsonOf(after) != jsonOf(before) {
		t.Fatalf("history after a restart %+v %v, before %+v", after, err, before)
	}
	for i := 0; i < 3; i++ {
		if r, err := c2.DRSPass(f.ctx); err != nil || len(r.Events) != 0 {
			t.Fatalf("pass %d after the restart: %+v %v", i, r, err)
		}
	}
	// Step c on the new controller: vm3 moves, vm2's entry is kept.
	f.c = c2
	if r := f.set("vm3/nic0.reservation=3Gbps"); kinds(r) != "set fault migrate" {
		t.Fatalf("step c: %s", kinds(r))
	}
	h, _ := c2.History(f.ctx)
	if h["vm2"] != before["vm2"] || h["vm3"].To != "h2" {
		t.Fatalf("history %+v", h)
	}
}

const pingPongPolicy = `cluster: pp
hosts:
  - {name: h1, cpu: {cores: 16, mhz: 2500}, memory: 128GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
  - {name: h2, cpu: {cores: 16, mhz: 2500}, memory: 128GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
vms:
  - {name: v1, host: h1, cpu: {vcpus: 4, reservationMHz: 8000}, memory: 8GiB}
  - {name: v2, host: h1, cpu: {vcpus: 4, reservationMHz: 8000}, memory: 8GiB}
  - {name: v3, host: h1, cpu: {vcpus: 4, reservationMHz: 8000}, memory: 8GiB}
  - {name: v4, host: h1, cpu: {vcpus: 4, reservationMHz: 8000}, memory: 8GiB}
  - {name: v5, host: h1, cpu: {vcpus: 4, reservationMHz: 8000}, memory: 8GiB}
`

// TestDRSNoPingPong: five VMs on one of two hosts, rebalancing at the
// most eager threshold (5), 120 periodic passes five minutes apart while
// the VMs' CPU reservations swing ±10% every pass (odd and even VMs in
// turn, the load that tempts a balancer most to move back and forth),
// and the controller restarted (a new one on the same etcd prefix) at
// pass 60. Rebalancing happens, but no VM moves twice within placement's
// cooldown (15 min) nor back to the host it left within its return
// window (1 h): the moves carried out, read back from the decisions in
// etcd, show it.
func TestDRSNoPingPong(t *testing.T) {
	f := newDRSFixture(t, DRSAutomatic, 5)
	now := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	f.c.cfg.Now = clock
	f.apply(pingPongPolicy)
	const passes, restartAt = 120, 60
	perPass := make([]int, passes)
	for pass := 0; pass < passes; pass++ {
		if pass == restartAt {
			f.c = New(Config{Client: testEtcd.Client, Prefix: f.c.cfg.Prefix, DRS: DRSAutomatic, RebalanceThreshold: 5, Now: clock})
		}
		var changes []string
		for i := 1; i <= 5; i++ {
			mhz := 8800
			if (i%2 == 0) == (pass%2 == 0) {
				mhz = 7200
			}
			changes = append(changes, fmt.Sprintf("v%d.cpu.reservation=%dMHz", i, mhz))
		}
		if _, err := f.c.Set(f.ctx, SetRequest{Changes: changes}); err != nil {
			t.Fatalf("pass %d: set: %v", pass, err)
		}
		r, err := f.c.DRSPass(f.ctx)
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		perPass[pass] = len(r.Events)
		now = now.Add(5 * time.Minute)
	}
	ds, err := f.cl.Decisions(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	type move struct {
		at       time.Time
		from, to string
	}
	last := map[string]move{}
	for _, d := range ds {
		if d.Status != "moving" && d.Status != "done" {
			t.Fatalf("decision %+v: DRS automatic leaves only moving or done ones", d)
		}
		if m, ok := last[d.VM]; ok {
			if d.Time.Sub(m.at) < 15*time.Minute {
				t.Errorf("%s moved at %v and again %v later (cooldown 15 min)", d.VM, m.at.Format("15:04"), d.Time.Sub(m.at))
			}
			if d.To == m.from && d.Time.Sub(m.at) < time.Hour {
				t.Errorf("ping-pong: %s back to %s %v after it left it", d.VM, d.To, d.Time.Sub(m.at))
			}
		}
		last[d.VM] = move{d.Time, d.From, d.To}
	}
	t.Logf("moves per pass: %v; %d moves in all", perPass, len(ds))
	if len(ds) < 2 || len(ds) > passes/4 {
		t.Fatalf("%d moves in %d passes: want rebalancing (≥ 2) without churn (≤ %d)", len(ds), passes, passes/4)
	}
}
