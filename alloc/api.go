// Package alloc computes entitlements: what every consumer in a tree is due,
// given a capacity and each consumer's reservation, shares, limit and demand
// (DESIGN.md §2). It is the one function that admission, placement, the
// simulator, the live agent and `sluice alloc`/`explain` all call.
//
// alloc is pure: it never imports time, net, os or os/exec, and it keeps no
// state between calls except reusable scratch space in a Solver. Values are
// in whatever unit the capacity is in (bits/s for networks, IOPS for
// storage); the package does not know or convert units.
package alloc

import "math"

// Inf stands for "no limit" and "unbounded demand".
var Inf = math.Inf(1)

// Semantics says how a node divides its entitlement among its children.
type Semantics uint8

const (
	// Additive (network, NetIOC): each child first gets min(R,L,D); the rest
	// goes by shares to all unsatisfied children, water-filled under min(L,D).
	Additive Semantics = iota
	// Floor (storage, mClock): each child gets max(R, its share), capped by
	// min(L,D), water-filled.
	Floor
)

// String returns "additive" or "floor".
func (s Semantics) String() string {
	if s == Floor {
		return "floor"
	}
	return "additive"
}

// Reason says what bound a node's entitlement.
type Reason uint8

const (
	Idle             Reason = iota // no demand
	ReservationBound               // got exactly its reservation (floor semantics, or shares gave nothing more)
	ShareBound                     // got its share of what was left
	LimitBound                     // capped by its limit
	DemandBound                    // capped by its demand
	Shortage                       // capacity could not cover the reservations; split in proportion to them
	CapacityBound                  // the root: got the whole capacity it was given
)

var reasonNames = [...]string{
	Idle:             "idle",
	ReservationBound: "reservation",
	ShareBound:       "shares",
	LimitBound:       "limit",
	DemandBound:      "demand",
	Shortage:         "shortage",
	CapacityBound:    "capacity",
}

// String returns the reason as one lower-case word, as `sluice alloc` prints
// it: idle, reservation, shares, limit, demand, shortage, capacity.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Node is one consumer in the tree. Inputs are set by the caller; Alloc,
// Reason and EffDemand are written by Compute. Leaves give Demand; an inner
// node's demand is the sum of its children's demands capped by its own Limit
// (its Demand field is ignored).
//
// Negative inputs are treated as 0; a Limit or Demand of Inf means none.
// Shares ≤ 0 means the node takes no part in dividing what is left after
// reservations (it gets min(R,L,D) and nothing more).
type Node struct {
	Name        string
	Reservation float64 // ≥ 0
	Shares      float64 // > 0 for a node that competes by shares
	Limit       float64 // Inf when unlimited
	Demand      float64 // Inf when unbounded (leaves only)
	Semantics   Semantics
	Children    []*Node

	// Outputs.
	Alloc     float64 // entitlement
	Reason    Reason
	EffDemand float64 // the demand Compute used: min(Demand, Limit) for a leaf, min(Σ children, Limit) for an inner node

	// level is the water level λ (units per share) at which this node's
	// children were divided; shortage says the children's reservations did
	// not fit. Kept for Explain.
	level    float64
	shortage bool
	// lo caches min(R, L, D) for the current computation.
	lo float64
}

// Compute fills Alloc, Reason and EffDemand of every node of the tree under
// root, the root being given capacity (and bounded by its own limit and
// demand; its reservation and shares play no part). It allocates scratch
// space on each call; use a Solver to compute repeatedly without allocating.
func Compute(root *Node, capacity float64) {
	var s Solver
	s.Compute(root, capacity)
}
