package controller

import (
	"testing"
	"time"
)

// TestHistoryReports: each report's measured rates are kept beside the
// ports' entitlements on the reporting host (Fig. 2 step a: vm1 8.13,
// vm2 and vm3 0.63 Gbps), served by GET /v1/history for one port or all.
func TestHistoryReports(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	vms := []string{"vm1", "vm2", "vm3"}
	l, err := f.cl.Register(f.ctx, "h1", Report{VMs: vms, Uplinks: []string{"vmnic0"},
		RatesBps: map[string]float64{"vm1/nic0": 8e9, "vm2/nic0": 0.6e9, "vm3/nic0": 0.6e9, "vm9/nic0": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Report(f.ctx, "h1", l.ID, Report{VMs: vms, Uplinks: []string{"vmnic0"},
		RatesBps: map[string]float64{"vm1/nic0": 8.1e9, "vm2/nic0": 0.62e9, "vm3/nic0": 0.61e9}}); err != nil {
		t.Fatal(err)
	}
	h, err := f.cl.History(f.ctx, "vm1/nic0")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Ports) != 1 || len(h.Ports[0].Samples) != 2 || h.WindowSeconds != 600 {
		t.Fatalf("history of vm1/nic0: %+v", h)
	}
	for i, want := range []float64{8e9, 8.1e9} {
		s := h.Ports[0].Samples[i]
		if s.Host != "h1" || s.MeasuredBps != want || gbps(s.EntitledBps) != "8.13" {
			t.Errorf("sample %d: %+v", i, s)
		}
	}
	all, err := f.cl.History(f.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range all.Ports {
		names = append(names, p.Port)
		if p.Port == "vm2/nic0" && gbps(p.Samples[1].EntitledBps) != "0.63" {
			t.Errorf("vm2/nic0: %+v", p.Samples)
		}
	}
	// vm9/nic0 has no entitlement on h1: not kept.
	if jsonOf(names) != jsonOf([]string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}) {
		t.Errorf("ports with a history: %v", names)
	}
	// A change of the policy changes the entitlement of the next report
	// (vm1 R=4.7: 4.7 + 4.7/3 Gbps), and vm3 stopped: it is no longer
	// entitled on h1, vm1 and vm2 share (4.7 + 4.7/2).
	f.set("vm1/nic0.reservation=4.7Gbps")
	if err := f.cl.Report(f.ctx, "h1", l.ID, Report{VMs: vms, Uplinks: []string{"vmnic0"}, RatesBps: map[string]float64{"vm1/nic0": 6e9}}); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Report(f.ctx, "h1", l.ID, Report{VMs: vms[:2], Uplinks: []string{"vmnic0"}, RatesBps: map[string]float64{"vm1/nic0": 7e9}}); err != nil {
		t.Fatal(err)
	}
	h, err = f.cl.History(f.ctx, "vm1/nic0")
	if err != nil {
		t.Fatal(err)
	}
	s := h.Ports[0].Samples
	if len(s) != 4 || gbps(s[2].EntitledBps) != "6.27" || gbps(s[3].EntitledBps) != "7.05" {
		t.Errorf("after the set and vm3's stop: %+v", s)
	}
}

// TestHistoryBound: a port keeps its last HistorySamples samples, and
// only those of the last HistoryWindow are served, oldest first.
func TestHistoryBound(t *testing.T) {
	var h rateHistory
	t0 := time.Unix(1_800_000_000, 0)
	ent := map[string]float64{"vm1/nic0": 1}
	for i := 0; i < HistorySamples+100; i++ {
		h.record("h1", t0.Add(time.Duration(i)*100*time.Millisecond), map[string]float64{"vm1/nic0": float64(i)}, ent)
	}
	last := t0.Add(time.Duration(HistorySamples+99) * 100 * time.Millisecond)
	got := h.get("vm1/nic0", last).Ports[0].Samples
	if len(got) != HistorySamples || got[0].MeasuredBps != 100 || got[len(got)-1].MeasuredBps != float64(HistorySamples+99) {
		t.Fatalf("%d samples, first %v, last %v", len(got), got[0], got[len(got)-1])
	}
	// 10 minutes later only the samples of the last 10 minutes remain.
	later := last.Add(HistoryWindow - 5*time.Second)
	if got := h.get("vm1/nic0", later).Ports[0].Samples; len(got) != 51 || got[0].MeasuredBps != float64(HistorySamples+49) {
		t.Fatalf("after %v: %d samples from %v", HistoryWindow, len(got), got[0])
	}
	if got := h.get("", last.Add(HistoryWindow+time.Second)); len(got.Ports) != 0 {
		t.Fatalf("after the window: %+v", got.Ports)
	}
	// Ports beyond HistoryPorts are not recorded.
	many := map[string]float64{}
	for i := 0; i < HistoryPorts+10; i++ {
		many[string(rune('a'+i%26))+string(rune(i))] = 1
	}
	h.record("h1", last, many, many)
	if n := len(h.rings); n != HistoryPorts {
		t.Fatalf("%d ports recorded, at most %d", n, HistoryPorts)
	}
}
