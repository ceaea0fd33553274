package storage

import "sluice/parda"

// windowControl sets one host's window on one datastore with package
// parda's scaled law (parda.Controller.UpdateScaled): the share term is a
// fraction b of the datastore's total window, split by active shares, and
// the threshold is lowered to (1−b)·L, so that the fixed point is
// latency = L exactly and windows in the ratio of the hosts' active
// shares, whatever the array's speed (docs/parda.md). The sums of windows
// and active shares of all hosts come from the datastore's stats region.
type windowControl struct {
	ctl         *parda.Controller
	thresholdNs float64 // L, for the status page
	w           float64
}

// newWindowControl returns the control for congestion threshold
// thresholdNs (L), starting at a window of 32.
func newWindowControl(thresholdNs float64) *windowControl {
	return &windowControl{
		ctl:         parda.New(parda.Config{ThresholdNs: thresholdNs, Gamma: 0.8, ShareTerm: 0.3, Min: 4, Max: 256}),
		thresholdNs: thresholdNs,
		w:           32,
	}
}

// update computes the next window from the datastore-wide latency (ns; 0 when
// no I/O completed anywhere), this host's active shares and the sums of
// active shares and windows of all hosts (this one included). The window at
// most doubles per period.
func (c *windowControl) update(latNs, shares, totalShares, totalWindow float64) float64 {
	c.w = c.ctl.UpdateScaled(c.w, latNs, shares, totalShares, totalWindow)
	return c.w
}
