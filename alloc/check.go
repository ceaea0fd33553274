package alloc

import (
	"fmt"
	"math"
)

// Check recomputes the invariants of DESIGN.md §2 on a tree that Compute
// has filled, independently of how Compute found the numbers, and returns
// one line per violation (none when all hold). tol is the absolute
// tolerance for comparisons (e.g. 1e-9 × capacity).
//
// At every level, with C the parent's allocation, lo = min(R,L,D) and
// hi = min(L,D) of each child:
//   - capacity: Σ children ≤ C, and the root ≤ capacity;
//   - bounds: 0 ≤ child ≤ hi (limits and demands never exceeded);
//   - reservations: when Σ lo ≤ C every child gets ≥ lo; otherwise every
//     child gets C × lo / Σ lo (shortage);
//   - work conservation: if a child with shares > 0 gets less than hi, the
//     children use all of C (and the root all of capacity, up to its demand);
//   - shares: share-bound children (strictly between their bounds) sit at
//     one water level λ — (alloc−lo)/S under Additive, alloc/S under Floor —
//     children capped at hi sit at or below λ, and under Floor children held
//     at their reservation have S·λ ≤ lo.
func Check(root *Node, capacity float64, tol float64) []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	var dem func(n *Node) float64
	dem = func(n *Node) float64 {
		if len(n.Children) == 0 {
			return math.Min(nonNeg(n.Demand), limit(n))
		}
		s := 0.0
		for _, c := range n.Children {
			s += dem(c)
		}
		return math.Min(s, limit(n))
	}
	rootDem := dem(root)
	if root.Alloc > capacity+tol {
		bad("%s: gets %g, more than the capacity %g", root.Name, root.Alloc, capacity)
	}
	if root.Alloc < math.Min(capacity, rootDem)-tol {
		bad("%s: gets %g, less than min(capacity %g, demand %g)", root.Name, root.Alloc, capacity, rootDem)
	}
	var walk func(p *Node)
	walk = func(p *Node) {
		if len(p.Children) == 0 {
			return
		}
		C := p.Alloc
		k := len(p.Children)
		los, his := make([]float64, k), make([]float64, k)
		sumLo, sum := 0.0, 0.0
		for i, c := range p.Children {
			his[i] = dem(c)
			los[i] = math.Min(nonNeg(c.Reservation), his[i])
			sumLo += los[i]
			sum += c.Alloc
		}
		if sum > C+tol {
			bad("%s: children get %g, more than its %g", p.Name, sum, C)
		}
		unmet := false
		for i, c := range p.Children {
			if c.Alloc < -tol || c.Alloc > his[i]+tol {
				bad("%s: gets %g, outside [0, min(limit, demand) %g]", c.Name, c.Alloc, his[i])
			}
			if c.Shares > 0 && c.Alloc < his[i]-tol {
				unmet = true
			}
		}
		if sumLo > C+tol {
			for i, c := range p.Children {
				if want := C * los[i] / sumLo; math.Abs(c.Alloc-want) > tol {
					bad("%s: shortage under %s: gets %g, not %g × %g / %g = %g", c.Name, p.Name, c.Alloc, C, los[i], sumLo, want)
				}
			}
		} else {
			for i, c := range p.Children {
				if c.Alloc < los[i]-tol {
					bad("%s: gets %g, less than its reservation %g (feasible: Σ %g ≤ %g)", c.Name, c.Alloc, los[i], sumLo, C)
				}
			}
			if unmet && sum < C-tol {
				bad("%s: demand unmet but only %g of %g used", p.Name, sum, C)
			}
			checkShares(p, los, his, tol, bad)
		}
		for _, c := range p.Children {
			walk(c)
		}
	}
	walk(root)
	return v
}

// checkShares checks the water level among one parent's children.
func checkShares(p *Node, los, his []float64, tol float64, bad func(string, ...any)) {
	level := func(i int) float64 {
		c := p.Children[i]
		if p.Semantics == Floor {
			return c.Alloc / c.Shares
		}
		return (c.Alloc - los[i]) / c.Shares
	}
	lamMin, lamMax := Inf, math.Inf(-1)
	var minName, maxName string
	for i, c := range p.Children {
		if c.Shares <= 0 || c.Alloc <= los[i]+tol || c.Alloc >= his[i]-tol {
			continue
		}
		l := level(i)
		if l < lamMin {
			lamMin, minName = l, c.Name
		}
		if l > lamMax {
			lamMax, maxName = l, c.Name
		}
	}
	if math.IsInf(lamMin, 1) {
		return // nobody share-bound
	}
	// Level tolerance: tol per share of the smallest share-bound child.
	stol := tol / minShares(p, los, his, tol)
	if lamMax-lamMin > stol {
		bad("%s: share-bound children at different levels: %s %g per share, %s %g", p.Name, minName, lamMin, maxName, lamMax)
	}
	for i, c := range p.Children {
		if c.Shares <= 0 {
			continue
		}
		if c.Alloc >= his[i]-tol && his[i] > los[i]+tol && level(i) > lamMax+stol {
			bad("%s: capped at %g but above the water level (%g > %g per share)", c.Name, c.Alloc, level(i), lamMax)
		}
		if p.Semantics == Floor && c.Alloc <= los[i]+tol && los[i] < his[i]-tol && c.Shares*lamMin > los[i]+tol {
			bad("%s: held at its reservation %g though its share %g is larger", c.Name, los[i], c.Shares*lamMin)
		}
	}
}

func minShares(p *Node, los, his []float64, tol float64) float64 {
	m := Inf
	for i, c := range p.Children {
		if c.Shares > 0 && c.Alloc > los[i]+tol && c.Alloc < his[i]-tol {
			m = math.Min(m, c.Shares)
		}
	}
	return m
}
