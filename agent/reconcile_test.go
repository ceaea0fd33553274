package agent

import "testing"

// TestReconcileRenewsClassInDebt: a leaf class whose rate is raised while it
// owes more than RenewDebtNs is re-created (full bucket), and the filter
// bound to it is put back; a class raised with a small debt, or lowered with
// a large one, is changed in place and keeps its debt.
func TestReconcileRenewsClassInDebt(t *testing.T) {
	const dev = "up0"
	root, leaf := MakeHandle(1, 1), MakeHandle(1, 100)
	floor := HTBClass{ID: leaf, Parent: root, RateBps: 30e3, CeilBps: 300e6, BurstBytes: MinBurstBytes, CburstBytes: MinBurstBytes, QuantumBytes: MinQuantumBytes}
	raised := floor
	raised.RateBps = 21.9e6
	lowered := floor
	lowered.RateBps = 20e3
	top := HTBClass{ID: root, Parent: MakeHandle(1, 0), RateBps: 300e6, CeilBps: 300e6, BurstBytes: MinBurstBytes, CburstBytes: MinBurstBytes}
	filters := []Filter{{Handle: 5, ClassID: leaf, Keys: []U32Key{{Mask: 0xffffffff, Val: 0x0a000002, Off: 12}}}}

	for _, tc := range []struct {
		name        string
		tokensNs    int64
		want        HTBClass
		renewed     int
		tokensAfter int64
	}{
		{"raised, 17 s in debt", -17e9, raised, 1, 0},
		{"raised, 50 ms in debt", -50e6, raised, 0, -50e6},
		{"lowered, 17 s in debt", -17e9, lowered, 0, -17e9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := NewFakeKernel(dev)
			if _, err := Reconcile(k, dev, 100, []HTBClass{top, floor}, filters, nil); err != nil {
				t.Fatal(err)
			}
			k.Devs[dev].Debt = map[Handle]int64{leaf: -tc.tokensNs}
			ch, err := Reconcile(k, dev, 100, []HTBClass{top, tc.want}, filters, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := k.Devs[dev].Classes[leaf]
			tokens, _ := k.ClassTokens(dev)
			if ch.ClassesRenewed != tc.renewed || c.RateBps != tc.want.RateBps || tokens[leaf] != tc.tokensAfter {
				t.Errorf("changes %s, renewed %d; class rate %d, tokens %d ns; want renewed %d, rate %d, tokens %d ns",
					ch, ch.ClassesRenewed, c.RateBps, tokens[leaf], tc.renewed, tc.want.RateBps, tc.tokensAfter)
			}
			if f, ok := k.Devs[dev].Filters[5]; !ok || f.ClassID != leaf {
				t.Errorf("filter 5 after reconcile: %+v (present %v), want it on %s", f, ok, leaf)
			}
			if ch, err := Reconcile(k, dev, 100, []HTBClass{top, tc.want}, filters, nil); err != nil || ch.Total() != 0 {
				t.Errorf("second reconcile wrote %s (%v)", ch, err)
			}
		})
	}
}
