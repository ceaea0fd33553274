package sim

import (
	"math"

	"sluice/alloc"
)

// TxScheduler decides which port's head segment an uplink transmits next.
// It sees every segment as it is queued (Enqueue) and hands out one port
// per Dequeue; the uplink keeps the segments of each port in order.
// nextNs, when ok is false, is the earliest time a port becomes eligible
// (0 when no port is backlogged).
type TxScheduler interface {
	Enqueue(port int, bytes int64, nowNs int64)
	Dequeue(nowNs int64) (port int, ok bool, nextNs int64)
}

// fifoSched is the "default scheduler" of the seeds: one FIFO for the whole
// uplink, first queued, first sent, no notion of ports.
type fifoSched struct {
	ring []int
	head int
}

func (f *fifoSched) Enqueue(port int, _ int64, _ int64) { f.ring = append(f.ring, port) }

func (f *fifoSched) Dequeue(int64) (int, bool, int64) {
	if f.head == len(f.ring) {
		return 0, false, 0
	}
	p := f.ring[f.head]
	f.head++
	if f.head > 4096 && f.head*2 > len(f.ring) {
		f.ring = append(f.ring[:0], f.ring[f.head:]...)
		f.head = 0
	}
	return p, true, 0
}

// schedPort is what the NetIOC scheduler knows about one port.
type schedPort struct {
	class    int
	res      float64 // bps
	shares   float64
	limit    float64 // bps, Inf when unlimited
	active   bool    // a workload is running on it (demand unbounded)
	queued   []int64 // bytes of the queued segments
	qhead    int
	finish   float64 // SFQ finish tag of the last dequeued segment
	weight   float64 // entitlement in bps, from alloc
	nextOkNs int64   // limit pacing
}

type schedClass struct {
	name     string
	res      float64
	shares   float64
	limit    float64
	nextOkNs int64
}

// netiocSched divides an uplink the NetIOC way: alloc computes every
// port's entitlement on the tree uplink → class → port (demand unbounded
// for ports with a running workload), and a start-time fair queue serves
// the backlogged ports in proportion to those entitlements, pacing ports
// and classes that have a limit. It stands in for hclock while that
// package is not in the tree.
type netiocSched struct {
	capacity float64
	classes  []schedClass
	ports    []*schedPort
	vtime    float64
	dirty    bool
	root     *alloc.Node
}

func (s *netiocSched) Enqueue(port int, bytes int64, _ int64) {
	p := s.ports[port]
	if !p.active && p.qhead == len(p.queued) {
		s.dirty = true // an idle port with traffic has demand again
	}
	p.queued = append(p.queued, bytes)
}

func (s *netiocSched) recompute() {
	s.dirty = false
	root := &alloc.Node{Name: "uplink", Shares: 1, Limit: alloc.Inf, Semantics: alloc.Additive}
	cls := make([]*alloc.Node, len(s.classes))
	for i, c := range s.classes {
		cls[i] = &alloc.Node{Name: c.name, Reservation: c.res, Shares: c.shares, Limit: c.limit, Semantics: alloc.Additive}
		root.Children = append(root.Children, cls[i])
	}
	leaves := make([]*alloc.Node, len(s.ports))
	for i, p := range s.ports {
		d := 0.0
		if p.active || p.qhead < len(p.queued) {
			d = alloc.Inf
		}
		leaves[i] = &alloc.Node{Reservation: p.res, Shares: p.shares, Limit: p.limit, Demand: d}
		cls[p.class].Children = append(cls[p.class].Children, leaves[i])
	}
	for _, c := range cls {
		if len(c.Children) == 0 {
			c.Children = []*alloc.Node{{Demand: 0, Limit: alloc.Inf}}
		}
	}
	compute(root, s.capacity)
	s.root = root
	for i, p := range s.ports {
		p.weight = leaves[i].Alloc
		if p.weight < 1 {
			p.weight = 1 // a port without entitlement still drains, last
		}
		// New weights start from the current virtual time: no port
		// carries credit or debt earned under the old ones.
		p.finish = math.Min(p.finish, s.vtime)
	}
}

func (s *netiocSched) Dequeue(nowNs int64) (int, bool, int64) {
	if s.dirty {
		s.recompute()
	}
	best, bestTag := -1, math.Inf(1)
	var nextNs int64
	for i, p := range s.ports {
		if p.qhead == len(p.queued) {
			continue
		}
		ok := p.nextOkNs
		if c := s.classes[p.class].nextOkNs; c > ok {
			ok = c
		}
		if ok > nowNs {
			if nextNs == 0 || ok < nextNs {
				nextNs = ok
			}
			continue
		}
		start := math.Max(s.vtime, p.finish)
		if start < bestTag {
			best, bestTag = i, start
		}
	}
	if best < 0 {
		return 0, false, nextNs
	}
	p := s.ports[best]
	b := p.queued[p.qhead]
	p.qhead++
	if p.qhead == len(p.queued) {
		p.queued, p.qhead = p.queued[:0], 0
		if !p.active {
			s.dirty = true
		}
	}
	s.vtime = bestTag
	p.finish = bestTag + float64(b*8)/p.weight
	if !math.IsInf(p.limit, 1) {
		p.nextOkNs = max(p.nextOkNs, nowNs) + int64(float64(b*8)/p.limit*1e9)
	}
	c := &s.classes[p.class]
	if !math.IsInf(c.limit, 1) {
		c.nextOkNs = max(c.nextOkNs, nowNs) + int64(float64(b*8)/c.limit*1e9)
	}
	return best, true, 0
}
