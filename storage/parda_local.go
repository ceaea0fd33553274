package storage

// This file holds the host window control of PARDA (Gulati et al., FAST
// 2009), pure: it stands in for package parda until that package's API is
// available to the gateway.
//
//	w(t+1) = (1-γ)·w(t) + γ·(L/lat(t)·w(t) + β)
//
// L is the congestion threshold, lat the datastore-wide normalised latency of
// the last period, β = BetaPerKShares × (active shares of the host)/1000.
// At the fixed point w = β/(1-L/lat): windows of the hosts stand in the ratio
// of their active shares, and lat = L + Σβ/IOPS stays close to L.

// pardaWindow is one host's window controller for one datastore.
type pardaWindow struct {
	thresholdNs    float64
	gamma          float64
	betaPerKShares float64
	minW, maxW     float64
	w              float64
}

func newPardaWindow(thresholdNs float64) *pardaWindow {
	return &pardaWindow{thresholdNs: thresholdNs, gamma: 0.5, betaPerKShares: 0.5, minW: 4, maxW: 256, w: 32}
}

// update computes the next window from the datastore-wide latency (ns; 0 when
// no I/O completed anywhere) and the host's active shares.
func (p *pardaWindow) update(latNs float64, activeShares float64) float64 {
	if latNs <= 0 {
		// No datastore I/O in the last period: no evidence of congestion.
		return p.w
	}
	beta := p.betaPerKShares * activeShares / 1000
	target := p.thresholdNs/latNs*p.w + beta
	nw := (1-p.gamma)*p.w + p.gamma*target
	nw = min(nw, 2*p.w)
	p.w = min(max(nw, p.minW), p.maxW)
	return p.w
}
