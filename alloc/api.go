// Package alloc computes entitlements: what every consumer in a tree is due,
// given a capacity and each consumer's reservation, shares, limit and demand
// (DESIGN.md §2). It is the one function that admission, placement, the
// simulator, the live agent and `sluice alloc`/`explain` all call.
//
// alloc is pure: it never imports time, net, os or os/exec. Values are in
// whatever unit the capacity is in (bits/s for networks, IOPS for storage).
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

// Reason says what bound a node's entitlement.
type Reason uint8

const (
	Idle             Reason = iota // no demand
	ReservationBound               // got exactly its reservation (floor semantics, or shares gave nothing more)
	ShareBound                     // got its share of what was left
	LimitBound                     // capped by its limit
	DemandBound                    // capped by its demand
	Shortage                       // capacity could not cover the reservations; split in proportion to them
)

// Node is one consumer in the tree. Inputs are set by the caller; Alloc and
// Reason are written by Compute. Leaves give Demand; an inner node's demand
// is the sum of its children's demands capped by its own Limit (its Demand
// field is ignored).
type Node struct {
	Name        string
	Reservation float64 // ≥ 0
	Shares      float64 // > 0 for a node that competes by shares
	Limit       float64 // Inf when unlimited
	Demand      float64 // Inf when unbounded (leaves only)
	Semantics   Semantics
	Children    []*Node

	// Outputs.
	Alloc  float64 // entitlement
	Reason Reason
}

// Compute fills Alloc and Reason of every node of the tree under root, the
// root being given capacity (and bounded by its own limit and demand).
// func Compute(root *Node, capacity float64)

// A Solver reuses scratch space so that repeated Compute calls on a
// prepared tree allocate nothing.
// type Solver struct{ ... }
// func (s *Solver) Compute(root *Node, capacity float64)
