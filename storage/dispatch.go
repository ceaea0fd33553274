package storage

import (
	"sync"
	"time"

	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
	"sluice/storage/nbd"
)

// op is one I/O request of a VM disk on its way to the datastore.
type op struct {
	kind    int // nbd.CmdRead, CmdWrite, CmdFlush, CmdTrim
	buf     []byte
	offset  uint64 // in the datastore export
	length  uint64 // for trim
	fua     bool
	cost    float64 // in I/O units (see ioCost)
	disk    int
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
// host on it, their mClock scheduler and the dispatcher under the window.
type datastoreGate struct {
	clk         Clock
	name        string
	ds          policy.Datastore
	up          *upstream
	exportBytes uint64
	statsOff    uint64
	parda       *parda.Controller // nil when SIOC is off

	mu          sync.Mutex
	sched       *mclock.Scheduler
	ops         map[uint64]*op // queued in sched, by handle
	nextHandle  uint64
	disks       []*disk
	window      float64
	outstanding int         // requests at the datastore
	stopTimer   func() bool // cancels the pending kick (nil: none)
	timerAt     time.Time
	closed      bool
	period      dsPeriod // counters of the current period
}

// dsPeriod accumulates the datastore I/O of this host during one period.
type dsPeriod struct {
	ios       uint64
	normLatNs float64 // Σ size-normalised latency (parda.DefaultSizeModel)
}

// submit queues o and waits until the datastore completed it. The
// goroutine of the request carries it out itself once the scheduler picks
// it (no hand-off when the datastore is not congested).
func (g *datastoreGate) submit(o *op) error {
	o.enqueue = g.clk.Now()
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return &nbd.Error{Errno: nbd.ESHUTDOWN}
	}
	g.nextHandle++
	if err := g.sched.Add(o.disk, mclock.Request{Bytes: int64(max(len(o.buf), 1)), Handle: g.nextHandle}, o.enqueue.UnixNano()); err != nil {
		// The disk is not the scheduler's: a gateway bug, refused
		// rather than left waiting forever.
		g.mu.Unlock()
		return &nbd.Error{Errno: nbd.EIO}
	}
	g.disks[o.disk].queued++
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
	for float64(g.outstanding) < g.window || g.outstanding == 0 {
		now := g.clk.Now()
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
		d := g.disks[o.disk]
		d.queued--
		d.inflight++
		started = append(started, o)
	}
	return started
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
	err := g.up.do(func(c *nbd.Client) error {
		switch o.kind {
		case nbd.CmdRead:
			return c.ReadAt(o.buf, o.offset)
		case nbd.CmdWrite:
			return c.WriteAt(o.buf, o.offset, o.fua)
		case nbd.CmdFlush:
			return c.Flush()
		case nbd.CmdTrim:
			return c.Trim(o.offset, o.length)
		}
		return &nbd.Error{Errno: nbd.EINVAL}
	})
	end := g.clk.Now()
	devNs := float64(end.Sub(start).Nanoseconds())
	g.mu.Lock()
	g.outstanding--
	d := g.disks[o.disk]
	d.inflight--
	if err == nil {
		g.period.ios++
		g.period.normLatNs += parda.DefaultSizeModel.Normalize(devNs, float64(len(o.buf)))
		d.record(len(o.buf), end.Sub(o.enqueue))
	}
	started := g.dispatchLocked(nil)
	g.mu.Unlock()
	startAll(started)
	return err
}

// disk is one VM disk served as an NBD export: a region of the datastore.
type disk struct {
	gate   *datastoreGate
	idx    int
	ext    Extent
	policy policy.Disk

	// guarded by gate.mu
	queued, inflight int
	cur              diskPeriod
}

// SizeBytes implements nbd.Backend.
func (d *disk) SizeBytes() uint64 { return d.ext.SizeBytes }

// ReadAt implements nbd.Backend.
func (d *disk) ReadAt(p []byte, off uint64) error {
	return d.gate.submit(&op{kind: nbd.CmdRead, buf: p, offset: d.ext.OffBytes + off, cost: ioCost(len(p)), disk: d.idx})
}

// WriteAt implements nbd.Backend: it returns only after the datastore
// acknowledged the write.
func (d *disk) WriteAt(p []byte, off uint64, fua bool) error {
	return d.gate.submit(&op{kind: nbd.CmdWrite, buf: p, offset: d.ext.OffBytes + off, fua: fua, cost: ioCost(len(p)), disk: d.idx})
}

// Flush implements nbd.Backend: every write this disk acknowledged was
// acknowledged by the datastore first, so a datastore flush issued now makes
// all of them durable.
func (d *disk) Flush() error {
	return d.gate.submit(&op{kind: nbd.CmdFlush, cost: 1, disk: d.idx})
}

// Trim implements nbd.Backend.
func (d *disk) Trim(off, n uint64) error {
	return d.gate.submit(&op{kind: nbd.CmdTrim, offset: d.ext.OffBytes + off, length: n, cost: 1, disk: d.idx})
}

// limitBurstNs is how far behind now a disk held back by a busy window or
// a late timer may let its limit tag fall (mclock.Config.LimitBurstNs), so
// that a limit is reached on a loaded host: at most limit × 0.3 s extra
// I/Os in any window.
const limitBurstNs = 300_000_000
