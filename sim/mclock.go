package sim

import "math"

// mclockQ is the per-host, per-datastore request scheduler: mClock tags
// (reservation, limit, proportional share) over the disks of the host's
// VMs. It stands in for package mclock while that is not in the tree and
// follows the mClock paper: requests whose reservation tag is due go first
// (earliest tag); otherwise, among disks under their limit, the smallest
// share tag.
type mclockQ struct {
	clients []*mcClient
}

type mcClient struct {
	resIOPS, shares, limIOPS float64
	r, l, p                  float64 // tags in seconds
	queue                    []*ioReq
}

func (m *mclockQ) add(c *mcClient, q *ioReq, nowNs int64) {
	now := float64(nowNs) / 1e9
	if len(c.queue) == 0 {
		if c.resIOPS > 0 {
			c.r = math.Max(c.r+1/c.resIOPS, now)
		}
		if !math.IsInf(c.limIOPS, 1) {
			c.l = math.Max(c.l+1/c.limIOPS, now)
		}
		c.p = math.Max(c.p+1/c.shares, m.minP(now))
	}
	c.queue = append(c.queue, q)
}

// minP keeps a returning client from claiming credit for its idle time.
func (m *mclockQ) minP(now float64) float64 {
	lo := math.Inf(1)
	for _, c := range m.clients {
		if len(c.queue) > 0 && c.p < lo {
			lo = c.p
		}
	}
	if math.IsInf(lo, 1) {
		return 0
	}
	return lo
}

// pull returns the next request or nil and the earliest time one becomes
// eligible (0 if none is queued).
func (m *mclockQ) pull(nowNs int64) (*ioReq, int64) {
	now := float64(nowNs) / 1e9
	var best *mcClient
	for _, c := range m.clients {
		if len(c.queue) > 0 && c.resIOPS > 0 && c.r <= now && (best == nil || c.r < best.r) {
			best = c
		}
	}
	viaRes := best != nil
	if best == nil {
		next := math.Inf(1)
		for _, c := range m.clients {
			if len(c.queue) == 0 {
				continue
			}
			if !math.IsInf(c.limIOPS, 1) && c.l > now {
				next = math.Min(next, c.l)
				continue
			}
			if best == nil || c.p < best.p {
				best = c
			}
		}
		if best == nil {
			if math.IsInf(next, 1) {
				return nil, 0
			}
			return nil, int64(math.Ceil(next * 1e9))
		}
	}
	q := best.queue[0]
	best.queue = best.queue[1:]
	if !viaRes && best.resIOPS > 0 {
		best.r -= 1 / best.resIOPS
	}
	if len(best.queue) > 0 {
		if best.resIOPS > 0 {
			best.r = math.Max(best.r+1/best.resIOPS, now)
		}
		if !math.IsInf(best.limIOPS, 1) {
			best.l = math.Max(best.l+1/best.limIOPS, now)
		}
		best.p += 1 / best.shares
	}
	return q, 0
}

// pardaCtl is the PARDA window controller of one host on one datastore
// (Gulati et al., FAST '09): every control period
//
//	w ← (1−γ)·w + γ·(L/lat · w + β)
//
// with L the congestion threshold, lat the datastore-wide latency and β
// proportional to the host's active shares; w is clamped to [4, 256]. It
// stands in for package parda while that is not in the tree.
type pardaCtl struct {
	gamma       float64
	betaPer1000 float64
	minW, maxW  float64
}

func (p pardaCtl) update(w, thresholdNs, latNs, activeShares float64) float64 {
	if latNs <= 0 {
		return math.Min(p.maxW, w+p.betaPer1000*activeShares/1000)
	}
	beta := p.betaPer1000 * activeShares / 1000
	w = (1-p.gamma)*w + p.gamma*(thresholdNs/latNs*w+beta)
	return math.Max(p.minW, math.Min(p.maxW, w))
}
