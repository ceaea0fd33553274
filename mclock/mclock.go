// Package mclock schedules I/O requests of many clients (virtual disks) on one
// device by reservation, shares and limit: mClock (Gulati, Merchant, Varman,
// OSDI 2010) with the dmClock extension for distributed servers.
//
// Every client has a reservation (IOPS it is guaranteed), shares (its weight
// for what is left) and a limit (IOPS it does not exceed over windows longer
// than Config.LimitBurstNs). The head request of
// each backlogged client carries three tags: R (reservation, real time),
// L (limit, real time) and P (proportional share, virtual time). Pull serves
// in two phases: the constraint phase serves the smallest R tag that is due
// (R ≤ now); otherwise the weight phase serves the smallest P tag among the
// clients under their limit (L ≤ now), and rebates the served request from
// the client's R tags so that the reservation counts only constraint-phase
// service. A client that was idle gets no credit for the idle time: its R and
// L tags start no earlier than now and its P tag no earlier than the P tags
// of the clients that kept the device busy. The long-run result is the
// floor semantics of package alloc: each client receives max(R, its share),
// capped by its limit and demand; when the reservations exceed the device,
// it is divided in proportion to them.
//
// A request costs ceil(Bytes/ChunkBytes) units (at least 1; 32 KiB chunks
// by default), and rates are in units per second: with the default chunk,
// a 4 KiB or 32 KiB request counts as one I/O, a 256 KiB request as eight.
//
// A client spread over several servers keeps a Tracker and sends its Delta
// and Rho with each request (dmClock), so that its settings hold for its
// total service.
//
// mclock is pure: it never reads a clock, sleeps, or does I/O; time is an
// argument (int64 nanoseconds on any monotonic origin) and requests are
// values that the caller carries out. It is not safe for concurrent use.
package mclock

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Heap kinds: the index of a client's tag and heap position.
const (
	kR = 0 // reservation heap: clients with a reservation and a queue, by R
	kP = 1 // ready heap: clients under their limit, by P
	kL = 2 // limit heap: clients at their limit, by L
)

type client struct {
	id     int
	params Params
	invR   float64 // ns per cost unit for R tags; 0 when no reservation
	invL   float64 // ns per cost unit for L tags; 0 when unlimited
	invW   float64 // virtual ns per cost unit for P tags

	// Tags of the last request served (adjusted), from which the head's
	// tags are computed when it reaches the head of the queue.
	rBase, lBase, pBase int64
	tag                 [3]int64 // head tags, by heap kind
	fresh               bool     // head arrived at an idle client
	headCost            int64
	headSince           int64 // when the head became the head

	q     []Request // ring buffer
	qHead int
	qLen  int

	stats ClientStats
}

// Scheduler is an mClock/dmClock request scheduler for one device.
type Scheduler struct {
	chunk      int64
	chunkShift uint // log2(chunk) when chunk is a power of two, else 0
	atLimit    AtLimit
	limitBurst int64     // Config.LimitBurstNs, defaults applied
	clients    []*client // by id; nil when absent
	heaps      [3]cheap
	vP         int64 // virtual time: P tag of the last weight-phase request
	queued     int
	last       Phase
	lastNs     int64 // latest time seen by Add or Pull
	pRebaseAt  int64 // P tag beyond which virtual time is shifted back

	// emptied is the client whose last request Pull just served, still in
	// the heaps under its served tags: its unlink is put off to the next
	// call, so that a client that sends its next request at once (an I/O
	// stream at depth 1) has its entries re-sorted in place rather than
	// removed and pushed again. Every method but that Add first settles
	// it; only virtualNow looks past it.
	emptied *client
}

// New returns an empty Scheduler.
func New(cfg Config) *Scheduler {
	s := &Scheduler{chunk: cfg.ChunkBytes, atLimit: cfg.AtLimit, pRebaseAt: pRebaseAt}
	if s.chunk <= 0 {
		s.chunk = DefaultChunkBytes
	}
	if s.chunk&(s.chunk-1) == 0 {
		s.chunkShift = uint(bits.TrailingZeros64(uint64(s.chunk)))
	}
	switch {
	case cfg.LimitBurstNs == 0:
		s.limitBurst = DefaultLimitBurstNs
	case cfg.LimitBurstNs > 0:
		s.limitBurst = cfg.LimitBurstNs
	}
	return s
}

// MaxClientID bounds client ids: ids index a slice, so use small numbers.
const MaxClientID = 1 << 24

// ErrUnknownClient is returned for a client id that was not added.
var ErrUnknownClient = errors.New("unknown client")

// Cost returns the cost units of a request of the given size.
func (s *Scheduler) Cost(bytes int64) int64 {
	if bytes <= s.chunk {
		return 1
	}
	if bytes > math.MaxInt64-s.chunk {
		return bytes/s.chunk + 1
	}
	if s.chunkShift > 0 {
		return (bytes + s.chunk - 1) >> s.chunkShift
	}
	return (bytes + s.chunk - 1) / s.chunk
}

// AddClient adds a client with id in [0, MaxClientID).
func (s *Scheduler) AddClient(id int, p Params) error {
	if id < 0 || id >= MaxClientID {
		return fmt.Errorf("client %d: id out of range [0, %d)", id, MaxClientID)
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("client %d: %w", id, err)
	}
	for len(s.clients) <= id {
		s.clients = append(s.clients, nil)
		for k := range s.heaps {
			s.heaps[k].pos = append(s.heaps[k].pos, -1)
		}
	}
	if s.clients[id] != nil {
		return fmt.Errorf("client %d: already added", id)
	}
	s.settle()
	c := &client{id: id, q: make([]Request, 4)}
	c.setParams(p)
	// A new client is like one idle for ever: its first request is due at
	// once by reservation and limit, and competes from virtual now.
	c.rBase, c.lBase = farPast, farPast
	c.pBase = s.virtualNow()
	s.clients[id] = c
	return nil
}

func (c *client) setParams(p Params) {
	c.params = p
	c.invR, c.invL = 0, 0
	if p.ReservationIOPS > 0 {
		c.invR = 1e9 / p.ReservationIOPS
	}
	if p.LimitIOPS > 0 && !math.IsInf(p.LimitIOPS, 1) {
		c.invL = 1e9 / p.LimitIOPS
	}
	c.invW = 1e9 / p.Shares
}

// Update changes a client's parameters; they apply from its current head
// request on. A reservation given to a client that had none counts from the
// latest time the Scheduler has seen (Add or Pull).
func (s *Scheduler) Update(id int, p Params) error {
	c := s.client(id)
	if c == nil {
		return fmt.Errorf("client %d: %w", id, ErrUnknownClient)
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("client %d: %w", id, err)
	}
	s.settle()
	hadR := c.invR > 0
	c.setParams(p)
	if !hadR && c.invR > 0 {
		// A new reservation counts from now, not from the client's start.
		c.rBase = max(c.rBase, s.lastNs)
	}
	if c.qLen > 0 {
		s.unlink(c)
		s.tagHead(c, c.fresh, c.headSince)
		s.link(c, c.headSince)
	}
	return nil
}

// RemoveClient removes a client and drops its queued requests, returning
// how many were dropped.
func (s *Scheduler) RemoveClient(id int) (dropped int, err error) {
	c := s.client(id)
	if c == nil {
		return 0, fmt.Errorf("client %d: %w", id, ErrUnknownClient)
	}
	s.settle()
	s.unlink(c)
	dropped = c.qLen
	s.queued -= c.qLen
	s.clients[id] = nil
	return dropped, nil
}

// Stats returns a client's counters; ok is false for an unknown client.
func (s *Scheduler) Stats(id int) (st ClientStats, ok bool) {
	c := s.client(id)
	if c == nil {
		return ClientStats{}, false
	}
	st = c.stats
	st.Queued = c.qLen
	return st, true
}

// Len returns the number of queued requests.
func (s *Scheduler) Len() int { return s.queued }

// LastPhase says in which phase the last successful Pull served.
func (s *Scheduler) LastPhase() Phase { return s.last }

func (s *Scheduler) client(id int) *client {
	if id < 0 || id >= len(s.clients) {
		return nil
	}
	return s.clients[id]
}

// Add queues req for client at nowNs. It fails only for an unknown client.
func (s *Scheduler) Add(id int, req Request, nowNs int64) error {
	c := s.client(id)
	if c == nil {
		return fmt.Errorf("client %d: %w", id, ErrUnknownClient)
	}
	s.lastNs = max(s.lastNs, nowNs)
	if c.qLen == len(c.q) {
		c.grow()
	}
	c.q[(c.qHead+c.qLen)&(len(c.q)-1)] = req
	c.qLen++
	s.queued++
	if c.qLen > 1 {
		return nil
	}
	// The client was idle: no credit for the idle time.
	if c == s.emptied {
		// Still in the heaps under the tags of the request just served.
		s.tagHead(c, true, nowNs)
		s.emptied = nil
		s.relink(c, nowNs)
		return nil
	}
	s.settle()
	s.tagHead(c, true, nowNs)
	s.link(c, nowNs)
	return nil
}

// settle unlinks the client Pull emptied, unless it has been given a request
// since (see Scheduler.emptied).
func (s *Scheduler) settle() {
	if c := s.emptied; c != nil {
		s.emptied = nil
		s.unlink(c)
	}
}

func (c *client) grow() {
	n := make([]Request, 2*len(c.q))
	for i := 0; i < c.qLen; i++ {
		n[i] = c.q[(c.qHead+i)&(len(c.q)-1)]
	}
	c.q, c.qHead = n, 0
}

// virtualNow is the P tag a client starting now is compared against: the
// smallest P tag among the clients under their limit, else the P tag of the
// last weight-phase request.
func (s *Scheduler) virtualNow() int64 {
	h := &s.heaps[kP]
	if len(h.a) == 0 {
		return s.vP
	}
	top := h.a[0]
	if e := s.emptied; e != nil && top.id == int64(e.id) {
		// The emptied client is not queued: the smallest is the least of
		// the top's children (up to four).
		if len(h.a) == 1 {
			return s.vP
		}
		top = h.a[1]
		for _, x := range h.a[2:min(len(h.a), 5)] {
			if x.less(top) {
				top = x
			}
		}
	}
	t := s.clients[top.id]
	return max(s.vP, t.tag[kP]-int64(float64(t.headCost)*t.invW))
}

// tagHead computes the tags of c's head request from the tags of its last
// served request (delayed tag calculation, as in dmclock's DelayedTagCalc).
// sinceNs is when the request became the head: its arrival if the client
// was idle (fresh), else the time its predecessor was served.
//
// R: an idle client starts no earlier than its arrival (no credit for idle
// time); a backlogged client keeps its deficit, so that a reservation
// missed while the device was busy (or overbooked) is made up, and an
// overbooked device is divided in proportion to the reservations.
// L: an idle client starts at its arrival; a backlogged one may lag now
// by at most LimitBurstNs (so it can make up that much of its limit after
// being held below it, and no more). P: virtual time; an idle client starts at virtualNow.
func (s *Scheduler) tagHead(c *client, fresh bool, sinceNs int64) {
	e := &c.q[c.qHead]
	cost := s.Cost(e.Bytes)
	c.headCost = cost
	c.fresh = fresh
	c.headSince = sinceNs
	if c.invR > 0 {
		r := c.rBase + int64(float64(int64(e.Rho)+cost)*c.invR)
		if fresh {
			r = max(r, sinceNs)
		}
		c.tag[kR] = r
	} else {
		c.tag[kR] = Never
	}
	floor := sinceNs
	if !fresh && c.invL > 0 {
		floor -= s.limitBurst
	}
	c.tag[kL] = max(c.lBase+int64(float64(int64(e.Delta)+cost)*c.invL), floor)
	p := c.pBase
	if fresh {
		p = max(p, s.virtualNow())
	}
	c.tag[kP] = p + int64(float64(int64(e.Delta)+cost)*c.invW)
}

// link puts a client with a tagged head into the heaps.
func (s *Scheduler) link(c *client, nowNs int64) {
	if c.tag[kR] != Never {
		s.heaps[kR].push(c.id, c.tag[kR])
	}
	if c.tag[kL] <= nowNs {
		s.heaps[kP].push(c.id, c.tag[kP])
	} else {
		s.heaps[kL].push(c.id, c.tag[kL])
	}
}

// unlink takes a client out of every heap.
func (s *Scheduler) unlink(c *client) {
	for k := range s.heaps {
		h := &s.heaps[k]
		if i := h.pos[c.id]; i >= 0 {
			h.remove(int(i))
		}
	}
}

// Pull returns the next request to send to the device at nowNs. When none
// can be served, ok is false and nextEligibleNs is the earliest time one
// could be (Never when nothing is queued); call Pull again then, or on the
// next Add.
func (s *Scheduler) Pull(nowNs int64) (req Request, clientID int, ok bool, nextEligibleNs int64) {
	s.settle()
	s.lastNs = max(s.lastNs, nowNs)
	hl, hp, hr := &s.heaps[kL], &s.heaps[kP], &s.heaps[kR]
	for len(hl.a) > 0 && hl.a[0].key <= nowNs {
		id := int(hl.a[0].id)
		hl.remove(0)
		hp.push(id, s.clients[id].tag[kP])
	}
	var id int64
	var phase Phase
	switch {
	case len(hr.a) > 0 && hr.a[0].key <= nowNs:
		id, phase = hr.a[0].id, Reservation
	case len(hp.a) > 0:
		id, phase = hp.a[0].id, Weight
	case s.atLimit == AllowWhenIdle && len(hl.a) > 0:
		id, phase = hl.a[0].id, OverLimit
	default:
		next := Never
		if len(hr.a) > 0 {
			next = hr.a[0].key
		}
		if len(hl.a) > 0 {
			next = min(next, hl.a[0].key)
		}
		s.last = NoPhase
		return Request{}, -1, false, next
	}
	c := s.clients[id]
	s.serve(c, phase, nowNs)
	if c.pBase > s.pRebaseAt {
		s.rebaseP()
	}
	e := c.q[c.qHead]
	c.q[c.qHead] = Request{}
	c.qHead = (c.qHead + 1) & (len(c.q) - 1)
	c.qLen--
	s.queued--
	if c.qLen == 0 {
		s.emptied = c // unlinked by the next call, unless it is its Add
	} else {
		s.tagHead(c, false, nowNs)
		s.relink(c, nowNs)
	}
	s.last = phase
	return e, c.id, true, nowNs
}

// limitFloor is the L tag base after serving c's head at nowNs: its L tag,
// but no more than LimitBurstNs behind now. Bounding the lag at service
// (not only when the tag was computed: the head may wait long) is what
// bounds a client's service over any window W by LimitIOPS·(W +
// LimitBurstNs) plus two requests (see Config.LimitBurstNs).
func (s *Scheduler) limitFloor(c *client, nowNs int64) int64 {
	if c.invL == 0 {
		return c.tag[kL]
	}
	return max(c.tag[kL], nowNs-s.limitBurst)
}

// serve moves c's tag bases past its head request and counts it.
func (s *Scheduler) serve(c *client, phase Phase, nowNs int64) {
	cost := c.headCost
	rebate := int64(float64(cost) * c.invR)
	switch phase {
	case Reservation:
		c.rBase, c.lBase, c.pBase = c.tag[kR], s.limitFloor(c, nowNs), c.tag[kP]
		c.stats.ByReservation += uint64(cost)
	case Weight:
		// Weight-phase service does not count toward the reservation.
		if c.invR > 0 {
			c.rBase = c.tag[kR] - rebate
		}
		c.lBase, c.pBase = s.limitFloor(c, nowNs), c.tag[kP]
		s.vP = max(s.vP, c.tag[kP]-int64(float64(cost)*c.invW))
		c.stats.ByWeight += uint64(cost)
	case OverLimit:
		// Free service: no reservation progress, no P charge, and the
		// limit tag is not pushed beyond now.
		if c.invR > 0 {
			c.rBase = c.tag[kR] - rebate
		}
		c.lBase = min(c.tag[kL], nowNs)
		c.stats.OverLimit += uint64(cost)
	}
	c.stats.Served++
	c.stats.ServedCost += uint64(cost)
}

// pRebaseAt bounds P tags: virtual time advances by 1e9/shares per cost
// unit, which with small shares at a high rate reaches int64's range in
// hours; before that all P tags are shifted back by the same amount, which
// changes no comparison.
const pRebaseAt int64 = 1 << 61

// rebaseP shifts every P tag (and virtual now) back by virtual now. O(n),
// once in a long while.
func (s *Scheduler) rebaseP() {
	d := s.virtualNow()
	s.vP -= d
	for _, c := range s.clients {
		if c == nil {
			continue
		}
		// A client that far behind virtual now (only an idle one can be)
		// is lifted to virtual now when it returns: clamping changes
		// nothing and keeps repeated shifts from overflowing.
		c.pBase = max(c.pBase-d, farPast)
		if c.qLen > 0 {
			c.tag[kP] = max(c.tag[kP]-d, farPast)
		}
	}
	for i := range s.heaps[kP].a {
		s.heaps[kP].a[i].key = s.clients[s.heaps[kP].a[i].id].tag[kP]
	}
}

// relink repositions a client whose head tags changed.
func (s *Scheduler) relink(c *client, nowNs int64) {
	hr, hp, hl := &s.heaps[kR], &s.heaps[kP], &s.heaps[kL]
	if i := hr.pos[c.id]; i >= 0 {
		hr.fix(int(i), c.tag[kR])
	} else if c.tag[kR] != Never {
		hr.push(c.id, c.tag[kR])
	}
	ready := c.tag[kL] <= nowNs
	ip, il := hp.pos[c.id], hl.pos[c.id]
	switch {
	case ip >= 0 && ready:
		hp.fix(int(ip), c.tag[kP])
	case il >= 0 && !ready:
		hl.fix(int(il), c.tag[kL])
	default:
		if ip >= 0 {
			hp.remove(int(ip))
		}
		if il >= 0 {
			hl.remove(int(il))
		}
		if ready {
			hp.push(c.id, c.tag[kP])
		} else {
			hl.push(c.id, c.tag[kL])
		}
	}
}
