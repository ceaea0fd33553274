package alloc

import (
	"cmp"
	"math"
	"math/bits"
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

// demand computes EffDemand and lo bottom-up.
func demand(n *Node) float64 {
	d := 0.0
	if len(n.Children) == 0 {
		d = nonNeg(n.Demand)
	} else {
		for _, c := range n.Children {
			d += demand(c)
		}
	}
	if l := limit(n); l < d {
		d = l
	}
	n.EffDemand = d
	n.lo = nonNeg(n.Reservation)
	if d < n.lo {
		n.lo = d
	}
	return d
}

// limit returns a node's limit, Inf when unset (NaN or negative count as 0).
func limit(n *Node) float64 { return nonNeg(n.Limit) }

func nonNeg(v float64) float64 {
	if v > 0 {
		return v
	}
	return 0 // also NaN
}

// lo is what a child gets first: min(R, L, D) (cached by demand).
func lo(n *Node) float64 { return n.lo }

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
	if !(sh > 0) || l >= h {
		if l >= h {
			return h, boundReason(c)
		}
		return l, ReservationBound
	}
	// Within relEps of a bound counts as at the bound: λ comes out of
	// floating-point sums, and a child held at its cap must say so.
	var a float64
	if sem == Floor {
		a = sh * lam
		if a <= l*(1+relEps) {
			return l, ReservationBound
		}
	} else {
		a = l + sh*lam
	}
	if a >= h*(1-relEps) {
		return h, boundReason(c)
	}
	return a, ShareBound
}

// relEps is the relative tolerance for deciding that an allocation sits at
// a bound.
const relEps = 1e-12

// level finds the water level λ at which the children's allocations add up
// to capacity, given sumLo < capacity < Σ hi. For Additive a child takes
// min(lo + S·λ, hi); for Floor clamp(S·λ, lo, hi). Both are piecewise linear
// in λ:
//
//	f(λ) = sumLo + Σ_{events e with x_e ≤ λ} s_e·(λ − x_e)
//
// where a child adds an event (x, +S) where it starts taking shares and
// (x, −S) where it stops. Rather than sort the events, level selects λ's
// segment by repeated partitioning around a pivot (as quickselect does):
// expected O(k) for k children, in place, no allocation.
func (s *Solver) level(kids []*Node, sem Semantics, capacity, sumLo float64) float64 {
	ev := s.events[:0]
	a0, b0 := 0.0, 0.0 // Σ s_e and Σ s_e·x_e over events known to lie at or below λ
	n0 := 0            // children taking shares at λ, by the same events
	last := 0.0        // the largest event known to lie at or below λ
	for _, c := range kids {
		l, h, sh := c.lo, c.EffDemand, c.Shares
		if !(sh > 0) || l >= h {
			continue
		}
		if sem == Floor {
			if l > 0 {
				ev = append(ev, event{l / sh, sh})
			} else {
				a0 += sh
				n0++
			}
			if !math.IsInf(h, 1) {
				ev = append(ev, event{h / sh, -sh})
			}
			continue
		}
		a0 += sh // starts at λ = 0
		n0++
		if !math.IsInf(h, 1) {
			ev = append(ev, event{(h - l) / sh, -sh})
		}
	}
	s.events = ev
	target := capacity - sumLo // f(λ) − sumLo = λ·A − B must reach this
	// Bad pivots could make partitioning quadratic; after 2·log₂k + 4
	// rounds the rest is sorted and scanned instead (O(k log k) worst case).
	rounds := 2*bits.Len(uint(len(ev))) + 4
	if testForceSort {
		rounds = 0
	}
	for len(ev) > 0 {
		if rounds == 0 {
			return scanSorted(ev, target, a0, b0, n0, last)
		}
		rounds--
		p := pivot(ev)
		// Partition: [0,i) below p, [i,j) equal, [j,len) above.
		i, j, k := 0, 0, len(ev)
		for j < k {
			switch x := ev[j].x; {
			case x < p:
				ev[i], ev[j] = ev[j], ev[i]
				i++
				j++
			case x > p:
				k--
				ev[j], ev[k] = ev[k], ev[j]
			default:
				j++
			}
		}
		a, b, cnt := a0, b0, n0
		for _, e := range ev[:j] {
			a += e.slope
			b += e.slope * e.x
			if e.slope > 0 {
				cnt++
			} else {
				cnt--
			}
		}
		if p*a-b >= target {
			ev = ev[:i] // λ ≤ p: the events at p and above do not count
			continue
		}
		a0, b0, n0, last = a, b, cnt, p // λ > p: every event up to p counts
		ev = ev[j:]
	}
	return solveLevel(target, a0, b0, n0, last)
}

// solveLevel is λ in the segment where n0 children take shares with
// Σ s = a0 and Σ s·x = b0.
func solveLevel(target, a0, b0 float64, n0 int, last float64) float64 {
	if n0 == 0 || a0 <= 0 {
		// Every child that takes shares is full (reached only when the
		// children that could use more have no shares).
		return last
	}
	return (target + b0) / a0
}

// testForceSort makes level always sort (tests of the fallback path).
var testForceSort bool

// scanSorted finishes level by sorting the remaining events and walking
// them in order.
func scanSorted(ev []event, target, a0, b0 float64, n0 int, last float64) float64 {
	slices.SortFunc(ev, func(a, b event) int { return cmp.Compare(a.x, b.x) })
	for i := 0; i < len(ev); {
		x := ev[i].x
		if x*a0-b0 >= target {
			break // λ ≤ x
		}
		for ; i < len(ev) && ev[i].x == x; i++ {
			a0 += ev[i].slope
			b0 += ev[i].slope * x
			if ev[i].slope > 0 {
				n0++
			} else {
				n0--
			}
		}
		last = x
	}
	return solveLevel(target, a0, b0, n0, last)
}

// pivot picks the median of the first, middle and last events' x.
func pivot(ev []event) float64 {
	a, b, c := ev[0].x, ev[len(ev)/2].x, ev[len(ev)-1].x
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	if a > b {
		b = a
	}
	return b
}
