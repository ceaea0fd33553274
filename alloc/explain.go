package alloc

import (
	"fmt"
	"math"
)

// Step is one level of an explanation: how Parent divided its entitlement
// among its children, seen from Node. All values are in the capacity's unit.
//
// A person can check a share-bound node by hand:
//
//	Level = Pool / ActiveShares
//	Additive: Node.Alloc = Lo + Node.Shares × Level
//	Floor:    Node.Alloc = Node.Shares × Level
//
// and a shortage as Node.Alloc = Capacity × Lo / Reserved.
type Step struct {
	Parent, Node *Node
	Semantics    Semantics // how Parent divides
	Capacity     float64   // Parent.Alloc: what this level divides
	Siblings     int       // children of Parent, Node included
	Active       int       // children with demand, Node included if it has any
	Reserved     float64   // Σ min(R,L,D) over the children: what reservations took first
	Shortage     bool      // Reserved > Capacity: split in proportion to min(R,L,D)
	// Fixed is what the children that are not share-bound took out of the
	// pool: under Additive their allocation above min(R,L,D), under Floor
	// their whole allocation.
	Fixed float64
	// Pool is what shares divided among the share-bound children:
	// Capacity − Reserved − Fixed (Additive) or Capacity − Fixed (Floor).
	Pool         float64
	ActiveShares float64 // Σ shares of the share-bound children
	Level        float64 // Pool / ActiveShares (per share); 0 when none is share-bound
	Lo           float64 // Node's min(R,L,D)
	Hi           float64 // Node's min(L,D): the most it can use
}

// ShareFraction is Node's part of the pool: Node.Shares / ActiveShares, or 0
// when Node is not share-bound.
func (s Step) ShareFraction() float64 {
	if s.Node.Reason != ShareBound || s.ActiveShares <= 0 {
		return 0
	}
	return s.Node.Shares / s.ActiveShares
}

// Find returns the path from root to the first node named name (depth
// first), root first, or nil if there is none.
func Find(root *Node, name string) []*Node {
	if root == nil {
		return nil
	}
	if root.Name == name {
		return []*Node{root}
	}
	for _, c := range root.Children {
		if p := Find(c, name); p != nil {
			return append([]*Node{root}, p...)
		}
	}
	return nil
}

// Allocs returns the entitlement of every node of the tree under root
// (after Compute), keyed by node name.
func Allocs(root *Node) map[string]float64 {
	out := map[string]float64{}
	var walk func(n *Node)
	walk = func(n *Node) {
		out[n.Name] = n.Alloc
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(root)
	return out
}

// Explain returns one Step per level along path (root first, as Find
// returns it), after Compute has run on the tree: len(path)-1 steps.
func Explain(path []*Node) []Step {
	var steps []Step
	for i := 1; i < len(path); i++ {
		p, n := path[i-1], path[i]
		st := Step{
			Parent: p, Node: n, Semantics: p.Semantics,
			Capacity: p.Alloc, Siblings: len(p.Children),
			Shortage: p.shortage,
			Lo:       lo(n), Hi: hi(n),
		}
		for _, c := range p.Children {
			l := lo(c)
			st.Reserved += l
			if c.EffDemand > 0 {
				st.Active++
			}
			if c.Reason == ShareBound {
				st.ActiveShares += c.Shares
				continue
			}
			if p.Semantics == Floor {
				st.Fixed += c.Alloc
			} else {
				st.Fixed += c.Alloc - l
			}
		}
		if !st.Shortage {
			st.Pool = st.Capacity - st.Fixed
			if p.Semantics == Additive {
				st.Pool -= st.Reserved
			}
			if st.ActiveShares > 0 {
				st.Level = st.Pool / st.ActiveShares
			}
		}
		steps = append(steps, st)
	}
	return steps
}

// Describe renders steps as sentences a person can check by hand, one
// string per line; num formats a value with its unit (e.g. "8.13Gbps").
func Describe(steps []Step, num func(float64) string) []string {
	var out []string
	for _, s := range steps {
		n := s.Node
		among := children(s.Siblings)
		if s.Active < s.Siblings {
			among = fmt.Sprintf("%s with demand (%d in all)", children(s.Active), s.Siblings)
		}
		out = append(out, fmt.Sprintf("%s divides %s among %s (%s semantics); %s: reservation %s, shares %s, limit %s, demand %s",
			s.Parent.Name, num(s.Capacity), among, s.Semantics, n.Name,
			num(nonNeg(n.Reservation)), shares(n.Shares), limitText(limit(n), num), limitText(n.EffDemand, num)))
		switch {
		case n.Reason == Idle:
			out = append(out, fmt.Sprintf("  %s has no demand: it gets 0", n.Name))
			continue
		case s.Shortage:
			out = append(out, fmt.Sprintf("  shortage: reservations need %s but only %s is there, so each child gets %s × its min(R,L,D) / %s",
				num(s.Reserved), num(s.Capacity), num(s.Capacity), num(s.Reserved)))
			out = append(out, fmt.Sprintf("  %s = %s × %s / %s = %s (shortage)", n.Name, num(s.Capacity), num(s.Lo), num(s.Reserved), num(n.Alloc)))
			continue
		}
		if s.Semantics == Additive {
			out = append(out, fmt.Sprintf("  reservations take %s first; %s is left for shares", num(s.Reserved), num(s.Capacity-s.Reserved)))
			if s.Fixed > 0 && s.ActiveShares == 0 {
				out = append(out, fmt.Sprintf("  children take %s of it above their reservations, all they can use; %s stays unused",
					num(s.Fixed), num(s.Pool)))
			} else if s.Fixed > 0 {
				out = append(out, fmt.Sprintf("  children held by their limit or demand take %s of it above their reservations; %s remains for %s shares",
					num(s.Fixed), num(s.Pool), shares(s.ActiveShares)))
			} else if s.ActiveShares > 0 {
				out = append(out, fmt.Sprintf("  %s shares compete for it", shares(s.ActiveShares)))
			}
		} else {
			out = append(out, fmt.Sprintf("  each child gets the larger of its reservation and its share, capped by limit and demand"))
			if s.Fixed > 0 && s.ActiveShares == 0 {
				out = append(out, fmt.Sprintf("  children take %s, all they can use; %s stays unused", num(s.Fixed), num(s.Pool)))
			} else if s.Fixed > 0 {
				out = append(out, fmt.Sprintf("  children held by their reservation, limit or demand take %s; %s remains for %s shares",
					num(s.Fixed), num(s.Pool), shares(s.ActiveShares)))
			} else if s.ActiveShares > 0 {
				out = append(out, fmt.Sprintf("  %s shares compete for all of it", shares(s.ActiveShares)))
			}
		}
		switch n.Reason {
		case ShareBound:
			frac := s.ShareFraction()
			if s.Semantics == Additive {
				out = append(out, fmt.Sprintf("  %s = reservation %s + %s/%s of %s = %s + %s = %s (shares)",
					n.Name, num(s.Lo), shares(n.Shares), shares(s.ActiveShares), num(s.Pool), num(s.Lo), num(frac*s.Pool), num(n.Alloc)))
			} else {
				out = append(out, fmt.Sprintf("  %s = %s/%s of %s = %s, above its reservation %s (shares)",
					n.Name, shares(n.Shares), shares(s.ActiveShares), num(s.Pool), num(n.Alloc), num(s.Lo)))
			}
		case ReservationBound:
			if s.Semantics == Floor && n.Shares > 0 && s.ActiveShares > 0 {
				out = append(out, fmt.Sprintf("  %s's share would be %s/%s of %s = %s, less than its reservation: it gets %s (reservation)",
					n.Name, shares(n.Shares), shares(s.ActiveShares), num(s.Pool), num(n.Shares*s.Level), num(n.Alloc)))
			} else {
				out = append(out, fmt.Sprintf("  %s gets its reservation %s and nothing more (reservation)", n.Name, num(n.Alloc)))
			}
		case LimitBound:
			out = append(out, fmt.Sprintf("  %s would get more but its limit caps it at %s (limit)", n.Name, num(n.Alloc)))
		case DemandBound:
			out = append(out, fmt.Sprintf("  %s gets all it asks for, %s (demand)", n.Name, num(n.Alloc)))
		}
	}
	return out
}

func children(k int) string {
	if k == 1 {
		return "1 child"
	}
	return fmt.Sprintf("%d children", k)
}

func shares(v float64) string { return fmt.Sprintf("%g", v) }

func limitText(v float64, num func(float64) string) string {
	if math.IsInf(v, 1) {
		return "unlimited"
	}
	return num(v)
}
