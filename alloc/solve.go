package alloc

import (
	"math"
	"slices"
)

// A Solver reuses scratch space so that repeated Compute calls on a
// prepared tree allocate nothing once the scratch has grown to the tree's
// largest fan-out. The zero value is ready to use. A Solver is not safe for
// concurrent use; use one per goroutine.
type Solver struct {
	events []event
}

// event is a point on the water level axis where a child starts or stops
// taking shares: slope is +S when it starts, -S when it stops.
type event struct {
	x     float64
	slope float64
}

// Compute fills Alloc, Reason and EffDemand of every node under root, the
// root being given capacity. See the package function Compute.
func (s *Solver) Compute(root *Node, capacity float64) {
	if root == nil {
		return
	}
	demand(root)
	c := nonNeg(capacity)
	root.Alloc = math.Min(c, root.EffDemand)
	switch {
	case root.EffDemand <= 0:
		root.Reason = Idle
	case root.Alloc < c:
		root.Reason = boundReason(root)
	default:
		root.Reason = CapacityBound
	}
	s.divide(root)
}

// demand computes EffDemand bottom-up.
func demand(n *Node) float64 {
	l := limit(n)
	if len(n.Children) == 0 {
		n.EffDemand = math.Min(nonNeg(n.Demand), l)
		return n.EffDemand
	}
	sum := 0.0
	for _, c := range n.Children {
		sum += demand(c)
	}
	n.EffDemand = math.Min(sum, l)
	return n.EffDemand
}

// limit returns a node's limit, Inf when unset (NaN or negative count as 0).
func limit(n *Node) float64 { return nonNeg(n.Limit) }

func nonNeg(v float64) float64 {
	if v > 0 {
		return v
	}
	return 0 // also NaN
}

// lo is what a child gets first: min(R, L, D).
func lo(n *Node) float64 { return math.Min(nonNeg(n.Reservation), n.EffDemand) }

// hi is the most a child can take: min(L, D).
func hi(n *Node) float64 { return n.EffDemand }

// boundReason names the bound of a node whose Alloc equals its EffDemand.
func boundReason(n *Node) Reason {
	if n.EffDemand <= 0 {
		return Idle
	}
	if l := limit(n); l <= n.EffDemand && !math.IsInf(l, 1) {
		return LimitBound
	}
	return DemandBound
}

// divide splits n.Alloc among n's children by n.Semantics, then recurses.
func (s *Solver) divide(n *Node) {
	kids := n.Children
	if len(kids) == 0 {
		return
	}
	capacity := n.Alloc
	n.level, n.shortage = 0, false

	sumLo, sumHi := 0.0, 0.0
	for _, c := range kids {
		sumLo += lo(c)
		sumHi += hi(c)
	}
	switch {
	case sumLo >= capacity && sumLo > 0:
		// Shortage (or exactly enough): split in proportion to min(R,L,D).
		n.shortage = sumLo > capacity
		f := capacity / sumLo
		for _, c := range kids {
			l := lo(c)
			c.Alloc = l * f
			switch {
			case c.EffDemand <= 0:
				c.Reason = Idle
			case n.shortage:
				c.Reason = Shortage
			case l >= hi(c):
				c.Reason = boundReason(c)
			case l == 0:
				c.Reason = ShareBound // a share of nothing
			default:
				c.Reason = ReservationBound
			}
		}
	case sumHi <= capacity:
		// Every child gets all it can use.
		n.level = Inf
		for _, c := range kids {
			c.Alloc = hi(c)
			c.Reason = boundReason(c)
		}
	default:
		lam := s.level(kids, n.Semantics, capacity, sumLo)
		n.level = lam
		for _, c := range kids {
			c.Alloc, c.Reason = share(c, n.Semantics, lam)
		}
	}
	for _, c := range kids {
		s.divide(c)
	}
}

// share is a child's allocation at water level lam, and why.
func share(c *Node, sem Semantics, lam float64) (float64, Reason) {
	l, h := lo(c), hi(c)
	if h <= 0 {
		return 0, Idle
	}
	sh := c.Shares
	if sh <= 0 || l >= h {
		if l >= h {
			return h, boundReason(c)
		}
		return l, ReservationBound
	}
	var a float64
	if sem == Floor {
		a = sh * lam
		if a <= l {
			return l, ReservationBound
		}
	} else {
		a = l + sh*lam
	}
	if a >= h {
		return h, boundReason(c)
	}
	return a, ShareBound
}

// level finds the water level λ at which the children's allocations add up
// to capacity, given sumLo < capacity < Σ hi. For Additive a child takes
// min(lo + S·λ, hi); for Floor clamp(S·λ, lo, hi). Both are piecewise linear
// in λ; the breakpoints are sorted once, O(k log k) for k children.
func (s *Solver) level(kids []*Node, sem Semantics, capacity, sumLo float64) float64 {
	ev := s.events[:0]
	slope := 0.0 // Σ shares of children taking shares at the current λ
	active := 0  // how many children that is
	for _, c := range kids {
		l, h, sh := lo(c), hi(c), c.Shares
		if sh <= 0 || l >= h {
			continue
		}
		if sem == Floor {
			ev = append(ev, event{l / sh, sh})
			if !math.IsInf(h, 1) {
				ev = append(ev, event{h / sh, -sh})
			}
			continue
		}
		slope += sh
		active++
		if !math.IsInf(h, 1) {
			ev = append(ev, event{(h - l) / sh, -sh})
		}
	}
	s.events = ev
	slices.SortFunc(ev, func(a, b event) int {
		switch {
		case a.x < b.x:
			return -1
		case a.x > b.x:
			return 1
		}
		return 0
	})
	lam, f := 0.0, sumLo
	for _, e := range ev {
		if slope > 0 {
			if next := f + slope*(e.x-lam); next >= capacity {
				return lam + (capacity-f)/slope
			} else {
				f = next
			}
		}
		lam = e.x
		slope += e.slope
		if e.slope > 0 {
			active++
		} else {
			active--
		}
		if active == 0 {
			slope = 0 // no rounding left-overs once the last child stops
		}
	}
	if slope > 0 {
		return lam + (capacity-f)/slope
	}
	return lam // everyone saturated (only through rounding)
}
