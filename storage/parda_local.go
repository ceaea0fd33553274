package storage

// This file holds the host window control of PARDA (Gulati et al., FAST
// 2009), pure: it stands in for package parda until that package's API is
// available to the gateway.
//
//	w(t+1) = (1-γ)·w(t) + γ·(L'/lat(t)·w(t) + β_i)
//	β_i    = b · W(t) · S_i/S          L' = (1-b)·L
//
// lat is the datastore-wide normalised latency of the last period, L the
// congestion threshold, S_i the active shares of this host's disks, S and
// W the sums of active shares and windows over all hosts (all read from the
// datastore's stats region, so every host computes the same values without
// a controller). At the fixed point every window is proportional to its
// host's shares (w_i = W·S_i/S) and lat = L: β scaled by W and the
// threshold lowered by (1-b) remove classic PARDA's latency offset
// lat = L + Σβ/IOPS, which depends on the array's speed. The share split
// converges by a factor (1-γ·b) per period.

// pardaWindow is one host's window controller for one datastore.
type pardaWindow struct {
	thresholdNs float64
	gamma       float64 // smoothing γ
	b           float64 // share term b
	minW, maxW  float64
	w           float64
}

func newPardaWindow(thresholdNs float64) *pardaWindow {
	return &pardaWindow{thresholdNs: thresholdNs, gamma: 0.8, b: 0.3, minW: 4, maxW: 256, w: 32}
}

// update computes the next window from the datastore-wide latency (ns; 0 when
// no I/O completed anywhere), this host's active shares and the sums of
// active shares and windows of all hosts (this one included).
func (p *pardaWindow) update(latNs, shares, totalShares, totalWindow float64) float64 {
	if latNs <= 0 {
		// No datastore I/O in the last period: no evidence of congestion.
		return p.w
	}
	beta := 0.0
	if totalShares > 0 {
		beta = p.b * totalWindow * shares / totalShares
	}
	target := (1-p.b)*p.thresholdNs/latNs*p.w + beta
	nw := (1-p.gamma)*p.w + p.gamma*target
	nw = min(nw, 2*p.w)
	p.w = min(max(nw, p.minW), p.maxW)
	return p.w
}
