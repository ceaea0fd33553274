package storage

import "sluice/parda"

// windowControl sets one host's window on one datastore with package
// parda's update law
//
//	w ← (1−γ)·w + γ·(L'/lat·w + β)
//
// fed so that the fixed point needs no knowledge of the array's speed:
//
//	β  = b · W · S_i/S      (W, S: sums of windows and active shares of all
//	                         hosts, read from the datastore's stats region)
//	L' = (1−b) · L          (L: the datastore's congestion threshold)
//
// Classic PARDA (β = constant·S_i) settles at lat = L + Σβ/IOPS, which
// depends on the array; with β scaled by the datastore's total window and
// the threshold lowered by (1−b), the fixed point is lat = L exactly and
// w_i = W·S_i/S: windows in the ratio of the hosts' active shares. The
// share split converges by a factor (1−γ·b) per period.
type windowControl struct {
	ctl         *parda.Controller
	thresholdNs float64 // L
	b           float64
	w           float64
}

// windowShareTerm is b: the fraction of the datastore window that the share
// term redistributes each period.
const windowShareTerm = 0.3

func newWindowControl(thresholdNs float64) *windowControl {
	return &windowControl{
		ctl:         parda.New(parda.Config{ThresholdNs: (1 - windowShareTerm) * thresholdNs, Gamma: 0.8, Min: 4, Max: 256}),
		thresholdNs: thresholdNs,
		b:           windowShareTerm,
		w:           32,
	}
}

// update computes the next window from the datastore-wide latency (ns; 0 when
// no I/O completed anywhere), this host's active shares and the sums of
// active shares and windows of all hosts (this one included). The window at
// most doubles per period.
func (c *windowControl) update(latNs, shares, totalShares, totalWindow float64) float64 {
	beta := 0.0
	if totalShares > 0 {
		beta = c.b * totalWindow * shares / totalShares
	}
	// parda computes β = BetaPerShare·activeShares: pass the shares that
	// give the scaled β.
	virtualShares := beta / c.ctl.Config().BetaPerShare
	c.w = min(c.ctl.Update(c.w, latNs, virtualShares), 2*c.w)
	return c.w
}
