// Package hclock is sluice's hierarchical packet scheduler for one uplink
// (uplink → traffic class → port), in the spirit of hClock (Billaud &
// Gulati, EuroSys 2013). Every node has a reservation, shares and a limit;
// ports hold FIFO queues of packet sizes. The link model (the simulator, or
// a live data path) enqueues packets as they arrive and calls Dequeue
// whenever the wire is free.
//
// The long-run rates it produces are the additive entitlements of package
// alloc (DESIGN.md §2): at every level a child is first served up to its
// reservation, and what is left is divided by shares among all backlogged
// children under their limits, reserved or not.
//
// hclock is pure: it never imports time, net, os or os/exec, and never
// allocates in steady state. Time is an argument (int64 nanoseconds). It is
// not safe for concurrent use.
package hclock

import (
	"math"
	"unsafe"
)

// Packet is what Dequeue hands out. A port's packets leave in the order
// they were queued, so the caller keeps the packets themselves (buffers,
// arrival times) in a FIFO per port and takes the head of Port's; the
// scheduler keeps only their sizes (4 bytes a packet, so that the queues
// of many ports stay in cache).
type Packet struct {
	Port  int // ID of the port it was queued at
	Bytes int // size in bytes
	// Phase is how the port's parent chose it: by reservation or by shares.
	Phase Phase
}

// Phase says how a node was chosen by its parent.
type Phase uint8

const (
	// ByShares: the node had the smallest share tag among its parent's
	// eligible children.
	ByShares Phase = iota
	// ByReservation: the node was behind its reservation.
	ByReservation
)

// node states within the parent.
const (
	stIdle     uint8 = iota // nothing queued below
	stEligible              // in the parent's R and S heaps
	stLimited               // in the parent's L heap, keyed by eligibleAt
)

// node is the hot per-node state, touched on every packet. Kept small:
// what is only read on configuration changes lives in cold.
type node struct {
	// First cache line: what choosing and charging read.
	rTag, sTag, lTag float64 // ns, virtual bytes/share, ns
	eligibleAt       float64 // ns: earliest time something below may be sent
	rNsPerByte       float64 // 8e9/min(R, lEff); 0 without reservation
	sPerByte         float64 // 1/shares
	lNsPerByte       float64 // 8e9/L; 0 when unlimited
	lSlackNs         float64 // limit credit a node may bank, in ns of its limit

	// Second cache line (the node is 128 bytes: two lines).
	in *inner // nil for ports

	// Ports: a ring of queued packets, s.slab[qOff : qOff+qCap].
	qBytes    int64
	qOff      int32
	qCap      int32
	qHead     int32
	qN        int32
	qBytesCap int32

	parent int32
	state  uint8
	isPort bool
	hBytes int32 // size of the packet at the head of the queue

	sentBytes, sentPackets uint64
}

// inner is the state of a node with children: its children's heaps.
type inner struct {
	rh, sh, lh iheap
	rOff       float64 // added to children's rTag (shortage debt bound)
	vt         float64 // share virtual time: last start tag served
	nActive    int32
}

// cold is per-node state that packets do not touch.
type cold struct {
	name                         string
	params                       Params
	lEff                         float64 // min(limit, Σ children's lEff): the most the subtree can take
	droppedBytes, droppedPackets uint64
	resvBytes                    uint64
}

// NodeStats are a node's counters. An inner node's Sent* count what its
// subtree sent; its Dropped* what its ports dropped.
type NodeStats struct {
	SentBytes, SentPackets uint64
	// ReservationBytes is the part of SentBytes the parent chose this node
	// for by reservation (the rest was by shares).
	ReservationBytes             uint64
	DroppedBytes, DroppedPackets uint64
	QueuedBytes, QueuedPackets   uint64 // now
}

// Scheduler is a hierarchical R/S/L packet scheduler. Build it with New.
type Scheduler struct {
	nodes   []node
	slab    []int32 // the packet sizes queued at ports
	cold    []cold
	root    int32
	rPos    []int32
	sPos    []int32
	lPos    []int32
	path    []step  // Dequeue's walk, one entry per level
	lastNow float64 // ns since epochNs
	epochNs int64   // the caller's time at which the scheduler's clock is 0
	started bool
	cfg     Config
	queued  int
	kids    [][]int32
	// creditBytes is Config.MaxCreditBytes as a float.
	creditBytes float64
}

// New builds a scheduler from a tree description. All memory it will use
// is allocated here (queues, heaps).
func New(cfg Config) (*Scheduler, error) {
	root, kids, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if cfg.LimitBurstBytes <= 0 {
		cfg.LimitBurstBytes = DefaultLimitBurstBytes
	}
	if cfg.MaxCreditBytes <= 0 {
		cfg.MaxCreditBytes = DefaultMaxCreditBytes
	}
	if cfg.MaxReservationLagNs <= 0 {
		cfg.MaxReservationLagNs = DefaultMaxReservationLagNs
	}
	n := len(cfg.Nodes)
	s := &Scheduler{
		nodes:       make([]node, n),
		cold:        make([]cold, n),
		root:        int32(root),
		rPos:        make([]int32, n),
		sPos:        make([]int32, n),
		lPos:        make([]int32, n),
		cfg:         cfg,
		kids:        kids,
		creditBytes: float64(cfg.MaxCreditBytes),
		epochNs:     math.MinInt64 / 2, // not started (see now)
	}
	for i := range s.rPos {
		s.rPos[i], s.sPos[i], s.lPos[i] = -1, -1, -1
	}
	slots := 0
	for i := range cfg.Nodes {
		nc := &cfg.Nodes[i]
		if len(kids[nc.ID]) == 0 {
			if nc.QueuePackets == 0 {
				nc.QueuePackets = DefaultQueuePackets
			}
			slots += nc.QueuePackets
		}
	}
	s.slab = make([]int32, slots)
	off := 0
	ents := make([]entry, 3*(n-1)+21*n+4)
	nInner := 0
	for _, k := range kids {
		if len(k) > 0 {
			nInner++
		}
	}
	ins := make([]inner, nInner)
	maxDepth := 0
	for i := range cfg.Nodes {
		nc := &cfg.Nodes[i]
		x := &s.nodes[nc.ID]
		x.parent = int32(nc.Parent)
		cd := &s.cold[nc.ID]
		cd.name = nc.Name
		cd.params = nc.Params
		if k := kids[nc.ID]; len(k) == 0 {
			x.isPort = true
			x.qOff, x.qCap = int32(off), int32(nc.QueuePackets)
			off += nc.QueuePackets
			x.qBytesCap = int32(nc.QueueBytes)
		} else {
			c := len(k)
			in := &ins[0]
			ins = ins[1:]
			in.rh = iheap{e: carve(&ents, c), pos: s.rPos}
			in.sh = iheap{e: carve(&ents, c), pos: s.sPos}
			in.lh = iheap{e: carve(&ents, c), pos: s.lPos}
			x.in = in
		}
	}
	for id := range s.nodes {
		d := 0
		for y := int32(id); y != int32(root); y = s.nodes[y].parent {
			d++
		}
		maxDepth = max(maxDepth, d)
	}
	s.path = make([]step, maxDepth)
	s.computeLEff(int32(root), kids)
	for id := range s.nodes {
		s.derive(int32(id))
		// A limit is a token bucket that starts full.
		s.nodes[id].lTag = math.Inf(-1)
	}
	return s, nil
}

// computeLEff fills lEff bottom-up from id.
func (s *Scheduler) computeLEff(id int32, kids [][]int32) float64 {
	cd := &s.cold[id]
	l := math.Inf(1)
	if !unlimited(cd.params.LimitBps) {
		l = cd.params.LimitBps
	}
	if len(kids[id]) > 0 {
		sum := 0.0
		for _, c := range kids[id] {
			sum += s.computeLEff(c, kids)
		}
		l = math.Min(l, sum)
	}
	cd.lEff = l
	return l
}

// derive computes a node's per-byte increments from its params.
func (s *Scheduler) derive(id int32) {
	x := &s.nodes[id]
	p := s.cold[id].params
	x.rNsPerByte = 0
	if r := math.Min(p.ReservationBps, s.cold[id].lEff); r > 0 {
		x.rNsPerByte = 8e9 / r
	}
	x.sPerByte = 0
	if p.Shares > 0 {
		x.sPerByte = 1 / p.Shares
	}
	x.lNsPerByte, x.lSlackNs = 0, 0
	if !unlimited(p.LimitBps) {
		x.lNsPerByte = 8e9 / p.LimitBps
		x.lSlackNs = float64(s.cfg.LimitBurstBytes) * x.lNsPerByte
	}
}

// carve cuts an empty heap of capacity c from the front of *ents, placed so
// that each group of four siblings (indexes 4i+1..4i+4) fills one 64-byte
// cache line, with three entries more than c so that the last group is
// always whole. The storage is filled with pad entries.
func carve(ents *[]entry, c int) []entry {
	e := *ents
	k := 0
	for k < 3 && (uintptr(unsafe.Pointer(&e[k+1]))%64) != 0 {
		k++
	}
	*ents = e[k+c+3:]
	h := e[k : k+c+3 : k+c+3]
	for i := range h {
		h[i] = pad
	}
	return h[:0]
}
