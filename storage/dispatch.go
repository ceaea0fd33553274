package storage

import (
	"fmt"
	"sync"
	"time"

	"sluice/internal/clock"
	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
	"sluice/storage/nbd"
)

// op is one I/O request of a VM disk on its way to the datastore.
type op struct {
	kind    int // nbd.CmdRead, CmdWrite, CmdFlush, CmdTrim
	buf     []byte
	offset  uint64 // in the volume
	length  uint64 // for trim
	fua     bool
	cost    float64 // in I/O units (see ioCost)
	disk    *disk
	seq     uint64 // flush: the disk's ackSeq when the flush was submitted
	err     error  // set instead of starting the request (its disk was dropped)
	enqueue time.Time
	start   chan struct{} // signalled when the scheduler picked the request
}

// ioCost is the cost of an I/O of n bytes in I/O units, the same as the
// scheduler's (package mclock: one unit per started 32 KiB, at least 1);
// flush and trim cost 1.
func ioCost(n int) float64 {
	return float64(max(1, (n+mclock.DefaultChunkBytes-1)/mclock.DefaultChunkBytes))
}

// datastoreGate is the gateway's part of one datastore: the disks of this
// host on it, their mClock scheduler, the dispatcher under the window, and
// the stats volume shared with the other hosts.
type datastoreGate struct {
	clk   clock.Clock
	name  string
	ds    policy.Datastore
	st    store
	stats volume            // the stats volume
	id    datastoreID       // the datastore's identity, read at start
	parda *parda.Controller // nil when SIOC is off

	// The stats slot (control loop only): this host's slot, -1 before it
	// has one, and how many slots a period reads.
	slot, scan int
	// capacity is the datastore's capacity as measured in the periods it
	// was congested in (control loop writes, under mu).
	capacity parda.Capacity

	mu          sync.Mutex
	sched       *mclock.Scheduler
	ops         map[uint64]*op // queued in sched, by handle
	nextHandle  uint64
	disks       map[int]*disk // by scheduler client id
	nextID      int
	window      float64
	outstanding int         // requests at the datastore
	slots       parda.Slots // how window bounds outstanding
	stopTimer   func() bool // cancels the pending kick (nil: none)
	timerAt     time.Time
	closed      bool
	failed      error    // the datastore is not the one the gateway started with: every request fails
	period      dsPeriod // counters of the current period
	// statsErr is why the last period could not read or write the stats
	// volume (nil: it could): the datastore does not answer.
	statsErr error
}

// dsPeriod accumulates the datastore I/O of this host during one period.
type dsPeriod struct {
	ios       uint64
	normLatNs float64 // Σ size-normalised latency (parda.DefaultSizeModel)
	peak      int     // most requests outstanding at the datastore at once
}

// submit queues o and waits until the datastore completed it. The
// goroutine of the request carries it out itself once the scheduler picks
// it (no hand-off when the datastore is not congested).
func (g *datastoreGate) submit(o *op) error {
	o.enqueue = g.clk.Now()
	g.mu.Lock()
	if g.closed || o.disk.removed {
		// A disk that left this host (its VM moved): the client sees the
		// gateway shut the disk down, and finds it at its new host.
		g.mu.Unlock()
		return &nbd.Error{Errno: nbd.ESHUTDOWN}
	}
	if g.failed != nil {
		g.mu.Unlock()
		return &nbd.Error{Errno: nbd.EIO}
	}
	o.seq = o.disk.ackSeq
	g.nextHandle++
	if err := g.sched.Add(o.disk.id, mclock.Request{Bytes: int64(max(len(o.buf), 1)), Handle: g.nextHandle}, o.enqueue.UnixNano()); err != nil {
		// The disk is not the scheduler's: a gateway bug, refused
		// rather than left waiting forever.
		g.mu.Unlock()
		return &nbd.Error{Errno: nbd.EIO}
	}
	o.disk.queued++
	g.ops[g.nextHandle] = o
	var buf [4]*op
	started := g.dispatchLocked(buf[:0])
	self := false
	for i, s := range started {
		if s == o {
			// Picked at once (the usual case when the datastore is not
			// congested): carry it out without a channel round trip.
			started = append(started[:i], started[i+1:]...)
			self = true
			break
		}
	}
	if !self {
		// Another goroutine's dispatch starts it, after this unlock.
		o.start = make(chan struct{}, 1)
	}
	g.mu.Unlock()
	startAll(started)
	if !self {
		<-o.start
		if o.err != nil {
			return o.err
		}
	}
	return g.issue(o)
}

// startAll lets the goroutines of the picked requests go.
func startAll(ops []*op) {
	for _, o := range ops {
		o.start <- struct{}{}
	}
}

// dispatchLocked picks requests while the window allows and returns them
// (appended to started); the caller starts them after unlocking. g.mu held.
func (g *datastoreGate) dispatchLocked(started []*op) []*op {
	for {
		now := g.clk.Now()
		if !g.slots.Allow(now.UnixNano(), g.outstanding, g.window) {
			return started
		}
		req, _, ok, waitNs := g.sched.Pull(now.UnixNano())
		if !ok {
			if waitNs != mclock.Never {
				at := time.Unix(0, waitNs)
				if g.stopTimer == nil || at.Before(g.timerAt) || g.timerAt.Before(now) {
					if g.stopTimer != nil {
						g.stopTimer()
					}
					g.timerAt = at
					g.stopTimer = g.clk.AfterFunc(at.Sub(now), g.kick)
				}
			}
			return started
		}
		o := g.ops[req.Handle]
		delete(g.ops, req.Handle)
		g.outstanding++
		g.slots.Note(now.UnixNano(), g.outstanding, g.window)
		g.period.peak = max(g.period.peak, g.outstanding)
		d := o.disk
		d.queued--
		d.inflight++
		started = append(started, o)
	}
}

// kick runs the dispatcher (when a limit or reservation tag comes due, or
// the window grew).
func (g *datastoreGate) kick() {
	g.mu.Lock()
	started := g.dispatchLocked(nil)
	g.mu.Unlock()
	startAll(started)
}

// issue performs o on the datastore, accounts for it and lets the next
// requests go.
func (g *datastoreGate) issue(o *op) error {
	start := g.clk.Now()
	d := o.disk
	var err error
	switch o.kind {
	case nbd.CmdRead:
		err = d.vol.readAt(o.buf, o.offset)
	case nbd.CmdWrite:
		err = d.vol.writeAt(o.buf, o.offset, o.fua)
	case nbd.CmdFlush:
		err = d.vol.flush()
	case nbd.CmdTrim:
		err = d.vol.trim(o.offset, o.length)
	default:
		err = &nbd.Error{Errno: nbd.EINVAL}
	}
	end := g.clk.Now()
	devNs := float64(end.Sub(start).Nanoseconds())
	g.mu.Lock()
	g.outstanding--
	g.slots.Note(end.UnixNano(), g.outstanding, g.window)
	d.inflight--
	err = d.settle(o, err)
	if err == nil {
		g.period.ios++
		g.period.normLatNs += parda.DefaultSizeModel.Normalize(devNs, float64(len(o.buf)))
		d.record(len(o.buf), end.Sub(o.enqueue))
		switch o.kind {
		case nbd.CmdRead:
			d.reads++
		case nbd.CmdWrite:
			d.writes++
		}
	}
	started := g.dispatchLocked(nil)
	g.mu.Unlock()
	startAll(started)
	return err
}

// disk is one VM disk served as an NBD export: a volume of the datastore.
type disk struct {
	gate   *datastoreGate
	id     int // the scheduler's client id
	vol    volume
	v      Volume
	policy policy.Disk

	// guarded by gate.mu
	queued, inflight int
	cur              diskPeriod
	lat              LatencyHistogram // the closed periods' latencies, since the disk was opened
	reads, writes    uint64           // completed successfully since the disk was opened
	removed          bool             // the disk left this gateway and was released
	// conns counts the connections that opened the disk. idle is set
	// when the disk's VM left the host: the disk is then served to those
	// connections only, and idle is closed when the last one ends.
	conns int
	idle  chan struct{}
	// Durability: ackSeq counts the writes acknowledged without FUA,
	// coveredSeq the first of them that a successful FLUSH covers. A
	// datastore connection replaced while ackSeq > coveredSeq may have
	// lost acknowledged writes (the old connection's server had them only
	// in a volatile cache), and a failed flush may have lost them too: lost
	// then fails every later FLUSH, so the VM learns it.
	ackSeq, coveredSeq uint64
	lost               error
}

// settle accounts for the outcome err of o and returns what the VM gets.
// gate.mu held.
func (d *disk) settle(o *op, err error) error {
	switch {
	case o.kind == nbd.CmdWrite && err == nil && !o.fua:
		d.ackSeq++
	case o.kind == nbd.CmdFlush && err != nil:
		if d.lost == nil {
			d.lost = fmt.Errorf("a flush failed: %w", err)
		}
	case o.kind == nbd.CmdFlush && d.lost != nil:
		return &nbd.Error{Errno: nbd.EIO}
	case o.kind == nbd.CmdFlush:
		d.coveredSeq = max(d.coveredSeq, o.seq)
	}
	return err
}

// connectionReplaced is called when the disk's volume got a new datastore
// connection: acknowledged writes that no flush covered may be gone.
func (d *disk) connectionReplaced() {
	g := d.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if d.ackSeq > d.coveredSeq && d.lost == nil {
		d.lost = fmt.Errorf("the datastore connection was replaced with %d acknowledged writes not flushed", d.ackSeq-d.coveredSeq)
	}
}

// SizeBytes implements nbd.Backend.
// Attach implements nbd.Attacher: a connection opened the disk; refused
// once the disk is leaving (idle set).
func (d *disk) Attach() bool {
	d.gate.mu.Lock()
	defer d.gate.mu.Unlock()
	if d.idle != nil {
		return false
	}
	d.conns++
	return true
}

// Detach implements nbd.Attacher: a connection of the disk ended.
func (d *disk) Detach() {
	d.gate.mu.Lock()
	defer d.gate.mu.Unlock()
	d.conns--
	if d.conns == 0 && d.idle != nil {
		close(d.idle)
	}
}

func (d *disk) SizeBytes() uint64 { return d.v.SizeBytes }

// ReadAt implements nbd.Backend.
func (d *disk) ReadAt(p []byte, off uint64) error {
	return d.gate.submit(&op{kind: nbd.CmdRead, buf: p, offset: off, cost: ioCost(len(p)), disk: d})
}

// WriteAt implements nbd.Backend: it returns only after the datastore
// acknowledged the write.
func (d *disk) WriteAt(p []byte, off uint64, fua bool) error {
	return d.gate.submit(&op{kind: nbd.CmdWrite, buf: p, offset: off, fua: fua, cost: ioCost(len(p)), disk: d})
}

// Flush implements nbd.Backend: every write this disk acknowledged was
// acknowledged by the datastore first, so a datastore flush issued now makes
// all of them durable, unless the datastore connection that acknowledged
// some of them is gone (then the flush fails: disk.lost).
func (d *disk) Flush() error {
	return d.gate.submit(&op{kind: nbd.CmdFlush, cost: 1, disk: d})
}

// Trim implements nbd.Backend.
func (d *disk) Trim(off, n uint64) error {
	return d.gate.submit(&op{kind: nbd.CmdTrim, offset: off, length: n, cost: 1, disk: d})
}

// limitBurstNs is how far behind now a disk held back by a busy window or
// a late timer may let its limit tag fall (mclock.Config.LimitBurstNs), so
// that a limit is reached on a loaded host: at most limit × 0.3 s extra
// I/Os in any window.
const limitBurstNs = 300_000_000
