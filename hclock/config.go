package hclock

import (
	"fmt"
	"math"
)

// Defaults used when a Config field is zero.
const (
	// DefaultQueuePackets is a port's queue capacity when NodeConfig.QueuePackets is 0.
	DefaultQueuePackets = 1024
	// DefaultLimitBurstBytes is the limit credit a node may bank (see Config.LimitBurstBytes).
	DefaultLimitBurstBytes = 64 << 10
	// DefaultMaxCreditBytes is the credit kept across limit holds (see Config.MaxCreditBytes).
	DefaultMaxCreditBytes = 128 << 10
	// DefaultMaxReservationLagNs bounds reservation debt (see Config.MaxReservationLagNs).
	DefaultMaxReservationLagNs = 50_000_000
	// MaxQueuePackets is the largest port queue, in packets.
	MaxQueuePackets = 1 << 20
	// MaxPacketBytes is the largest packet Enqueue accepts (a 64 KiB GSO
	// segment plus headers).
	MaxPacketBytes = 1 << 17
)

// Never is the nextEligibleNs that Dequeue returns when nothing is queued:
// the caller waits for the next Enqueue, not for a time.
const Never int64 = math.MaxInt64

// NodeConfig describes one node of the scheduling tree. The root is the
// uplink; its children are traffic classes; a node without children is a
// port, which owns a FIFO queue. Any depth is accepted.
type NodeConfig struct {
	// ID identifies the node: IDs are 0..len(Config.Nodes)-1, each used once.
	// Enqueue takes the ID of a port.
	ID int
	// Parent is the ID of the parent node, or -1 for the root (exactly one).
	Parent int
	// Name is for messages only.
	Name string
	// Params are the node's reservation, shares and limit.
	Params
	// QueuePackets is a port's queue capacity in packets (0: DefaultQueuePackets).
	// Ignored for inner nodes.
	QueuePackets int
	// QueueBytes, when > 0, also caps the bytes queued at a port.
	QueueBytes int
}

// Params are a node's controls. Rates are in bits per second of payload
// (the unit of the link rate the caller drains the scheduler at).
type Params struct {
	// ReservationBps is the guaranteed minimum; 0 for none. It is served
	// ahead of shares while the node is behind it (additive semantics: the
	// reserved part is not counted against the node's shares).
	ReservationBps float64
	// Shares is the node's weight for what is left after reservations; > 0.
	// Ignored for the root.
	Shares float64
	// LimitBps caps the node; +Inf means unlimited, and so does 0 (the zero
	// value). Callers convert a policy limit with entitle.RateLimit.
	LimitBps float64
}

// Config is the whole scheduler description.
type Config struct {
	Nodes []NodeConfig
	// LimitBurstBytes is how much limit credit a node may bank, in bytes
	// (0: DefaultLimitBurstBytes). Some credit is needed so that a node that
	// was served late because the wire was busy with a large packet still
	// reaches its limit; the cost is that a limited node may send this many
	// bytes back to back after an idle period.
	LimitBurstBytes int
	// MaxCreditBytes is how much service a node that stayed backlogged but
	// was held back by a limit (its own or one below it) may still be owed
	// when it becomes eligible again, in bytes (0: DefaultMaxCreditBytes).
	// Its reservation and share tags are clamped to that. It must cover what
	// accrues while a limit briefly holds a node after a large packet (a
	// 64 KB GSO segment); it is also the largest burst such a node can
	// claim. A node that was idle (nothing queued) keeps no credit at all.
	MaxCreditBytes int
	// MaxReservationLagNs bounds how far behind the clock the reservation
	// tags of a node's eligible children may fall (0:
	// DefaultMaxReservationLagNs). They only fall behind when the
	// reservations cannot all be met (shortage); the bound keeps the debt of
	// a shortage from being paid out long after it ended.
	MaxReservationLagNs int64
}

func unlimited(bps float64) bool {
	return bps <= 0 || math.IsInf(bps, 1)
}

// validate checks the tree and returns the root id and children lists.
func (c *Config) validate() (root int, kids [][]int32, err error) {
	n := len(c.Nodes)
	if n == 0 {
		return 0, nil, fmt.Errorf("hclock: empty tree")
	}
	byID := make([]*NodeConfig, n)
	root = -1
	for i := range c.Nodes {
		nc := &c.Nodes[i]
		if nc.ID < 0 || nc.ID >= n {
			return 0, nil, fmt.Errorf("hclock: node %q: id %d out of range 0..%d", nc.Name, nc.ID, n-1)
		}
		if byID[nc.ID] != nil {
			return 0, nil, fmt.Errorf("hclock: node %q: id %d used twice", nc.Name, nc.ID)
		}
		byID[nc.ID] = nc
	}
	kids = make([][]int32, n)
	for id, nc := range byID {
		if nc.Parent == -1 {
			if root >= 0 {
				return 0, nil, fmt.Errorf("hclock: node %q: second root (first is %q)", nc.Name, byID[root].Name)
			}
			root = id
			continue
		}
		if nc.Parent < 0 || nc.Parent >= n || nc.Parent == id {
			return 0, nil, fmt.Errorf("hclock: node %q: parent %d is not a node", nc.Name, nc.Parent)
		}
		kids[nc.Parent] = append(kids[nc.Parent], int32(id))
	}
	if root < 0 {
		return 0, nil, fmt.Errorf("hclock: no root (a node with parent -1)")
	}
	// Every node must reach the root (no cycles).
	for id := range byID {
		x, steps := id, 0
		for x != root {
			x = byID[x].Parent
			if steps++; steps > n {
				return 0, nil, fmt.Errorf("hclock: node %q: parent chain has a cycle", byID[id].Name)
			}
		}
	}
	if len(kids[root]) == 0 {
		return 0, nil, fmt.Errorf("hclock: root %q has no children", byID[root].Name)
	}
	for id, nc := range byID {
		if err := checkParams(nc.Name, nc.Params, id == root); err != nil {
			return 0, nil, err
		}
		if len(kids[id]) == 0 && (nc.QueuePackets < 0 || nc.QueueBytes < 0 || nc.QueuePackets > MaxQueuePackets || nc.QueueBytes > math.MaxInt32) {
			return 0, nil, fmt.Errorf("hclock: port %q: queue capacity must be 0..%d packets and 0..%d bytes", nc.Name, MaxQueuePackets, math.MaxInt32)
		}
	}
	return root, kids, nil
}

func checkParams(name string, p Params, isRoot bool) error {
	if p.ReservationBps < 0 || math.IsNaN(p.ReservationBps) || math.IsInf(p.ReservationBps, 0) {
		return fmt.Errorf("hclock: node %q: reservation %v must be finite and ≥ 0", name, p.ReservationBps)
	}
	if math.IsNaN(p.LimitBps) {
		return fmt.Errorf("hclock: node %q: limit is NaN", name)
	}
	if !isRoot && !(p.Shares > 0 && !math.IsInf(p.Shares, 0)) {
		return fmt.Errorf("hclock: node %q: shares %v must be > 0", name, p.Shares)
	}
	return nil
}
