package controller

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// stored renders every key the controller keeps under its prefix with its
// value and mod revision: what a what-if must leave as it was.
func (f *fixture) stored() string {
	f.t.Helper()
	resp, err := f.c.cfg.Client.Get(f.ctx, f.c.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		f.t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s @%d = %s\n", kv.Key, kv.ModRevision, kv.Value)
	}
	return b.String()
}

func gbps(v float64) string { return fmt.Sprintf("%.2f", v/1e9) }

// rateLines renders a what-if's rates as PORT UPLINK GBPS (was GBPS).
func rateLines(w WhatIfResult) string {
	var b strings.Builder
	for _, r := range w.Rates {
		fmt.Fprintf(&b, "%s %s %s (was %s on %s)\n", r.Port, r.Uplink, gbps(r.AllocBps), gbps(r.BeforeBps), r.BeforeUplink)
	}
	return b.String()
}

// TestWhatIfFig2StepB: a what-if of seed Fig. 2 step b (vm2 reserves
// 4.5 Gbps after vm1's 7.5 Gbps) is admitted with a fault that placement
// repairs by moving vm2 to h2, and gives the seed's rates after the move
// (h1: vm1 8.45, vm3 0.95; h2: vm2 9.4 Gbps); in both DRS modes the
// stored state (policy, placement, desired states, events, decisions) is
// byte for byte what it was.
func TestWhatIfFig2StepB(t *testing.T) {
	for _, mode := range []DRSMode{DRSManual, DRSAutomatic} {
		t.Run(string(mode), func(t *testing.T) {
			f := newDRSFixture(t, mode, 1)
			f.apply(readExample(t, "netioc-fig2.yaml"))
			if _, err := f.cl.Register(f.ctx, "h2", Report{VMs: []string{}, Uplinks: []string{"vmnic0"}}); err != nil {
				t.Fatal(err)
			}
			f.set("vm1/nic0.reservation=7.5Gbps")
			before := f.stored()
			w, err := f.cl.WhatIf(f.ctx, SetRequest{Changes: []string{"vm2/nic0.reservation=4.5Gbps"}, Reason: "step b?"})
			if err != nil {
				t.Fatal(err)
			}
			if after := f.stored(); after != before {
				t.Fatalf("a what-if changed the stored state:\nbefore\n%s\nafter\n%s", before, after)
			}
			wantStatus := map[DRSMode]string{DRSManual: "recommended", DRSAutomatic: "moving"}[mode]
			if !w.Admitted || len(w.Moves) != 1 || w.Moves[0].VM != "vm2" || w.Moves[0].From != "h1" || w.Moves[0].To != "h2" || w.Moves[0].Status != wantStatus {
				t.Fatalf("what-if: %+v", w)
			}
			if kinds(Result{Events: w.Events}) != map[DRSMode]string{DRSManual: "set fault recommend", DRSAutomatic: "set fault migrate"}[mode] {
				t.Fatalf("events: %+v", w.Events)
			}
			want := "vm1/nic0 h1/vmnic0 8.45 (was 8.13 on h1/vmnic0)\n" +
				"vm2/nic0 h2/vmnic0 9.40 (was 0.63 on h1/vmnic0)\n" +
				"vm3/nic0 h1/vmnic0 0.95 (was 0.63 on h1/vmnic0)\n"
			if got := rateLines(w); got != want {
				t.Fatalf("rates after step b:\n%swant (seed Fig. 2)\n%s", got, want)
			}
			if len(w.Faults) != 0 || fmt.Sprint(w.Hosts) != "[{h1 [vm1 vm3]} {h2 [vm2]}]" {
				t.Fatalf("after the move: hosts %v, faults %v", w.Hosts, w.Faults)
			}
			// The same change made for real records what the what-if said.
			r, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm2/nic0.reservation=4.5Gbps"}, Reason: "step b?"})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Events) != len(w.Events) {
				t.Fatalf("set %+v, what-if said %+v", r.Events, w.Events)
			}
			for i := range r.Events {
				if r.Events[i].Kind != w.Events[i].Kind || r.Events[i].Message != w.Events[i].Message || r.Events[i].Reason != w.Events[i].Reason {
					t.Errorf("event %d: set %+v, what-if %+v", i, r.Events[i], w.Events[i])
				}
			}
		})
	}
}

// TestWhatIfRefused: a change no migration can mend is answered as
// refused with the reason Set gives; a malformed one is 400, as for Set;
// nothing is written either way.
func TestWhatIfRefused(t *testing.T) {
	f := newDRSFixture(t, DRSManual, 1)
	if _, err := f.cl.WhatIf(f.ctx, SetRequest{Changes: []string{"vm1/nic0.reservation=1Gbps"}}); StatusOf(err) != http.StatusConflict {
		t.Fatalf("what-if without a policy: %v", err)
	}
	f.apply(readExample(t, "netioc-fig2.yaml"))
	before := f.stored()
	change := "vm1/nic0.reservation=9Gbps"
	w, err := f.cl.WhatIf(f.ctx, SetRequest{Changes: []string{change}})
	if err != nil || w.Admitted || w.Refusal == "" || len(w.Moves) != 0 {
		t.Fatalf("what-if of %s: %+v %v", change, w, err)
	}
	_, serr := f.cl.Set(f.ctx, SetRequest{Changes: []string{change}})
	if StatusOf(serr) != http.StatusConflict || serr.Error() != w.Refusal {
		t.Fatalf("set of %s: %v; what-if said %q", change, serr, w.Refusal)
	}
	for _, bad := range [][]string{nil, {"vm1/nic0.reservation=lots"}, {"vm1.host=h2"}} {
		if _, err := f.cl.WhatIf(f.ctx, SetRequest{Changes: bad}); StatusOf(err) != http.StatusBadRequest {
			t.Errorf("what-if of %q: %v, want 400", bad, err)
		}
	}
	if after := f.stored(); after != before {
		t.Fatalf("state changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}
