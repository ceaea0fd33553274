package nbd

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
)

// request is one decoded transmission-phase request.
type request struct {
	flags  uint16
	typ    uint16
	handle uint64
	off    uint64
	length uint32
	data   []byte // WRITE payload
}

// transmission serves requests until DISC, EOF or a protocol violation.
// Requests are processed concurrently (up to MaxInFlight) and answered in
// completion order.
//
// Workers take turns as the connection's reader (leader/follower): the
// worker that read a request passes the reader role on and serves the
// request itself, so no goroutine hand-off lies between a request arriving
// and its being served; waking the next reader happens beside it.
func (c *serverConn) transmission(b Backend, name string) error {
	max := c.s.MaxInFlight
	if max <= 0 {
		max = 128
	}
	// Replies are written into the buffer by the workers and flushed by one
	// flusher goroutine, so that replies completing together share a write
	// system call.
	c.flushReq = make(chan struct{}, 1)
	flusherDone := make(chan struct{})
	go c.flusher(flusherDone)
	maxBytes := c.s.MaxInFlightBytes
	if maxBytes <= 0 {
		maxBytes = 64 << 20
	}
	if maxBytes < MaxPayloadBytes {
		maxBytes = MaxPayloadBytes
	}
	turnLen := int64(c.s.TurnRequests)
	if turnLen <= 0 {
		turnLen = DefaultTurnRequests
	}
	t := &transmitter{c: c, b: b, name: name, size: b.SizeBytes(), max: max, turnLen: turnLen}
	if c.acc.Allow != nil && c.id != "" {
		// A client with an identity (a VM) has one budget over all its
		// connections: more connections buy it neither more memory, nor
		// more requests in flight, nor longer turns.
		perID := c.s.MaxInFlightPerIdentity
		if perID <= 0 {
			perID = DefaultMaxInFlightPerIdentity
		}
		sh, release := c.s.identityShare(c.id, maxBytes, int64(perID))
		defer release()
		t.share = sh
	} else {
		t.share = newClientShare(maxBytes, int64(max), c.s.testBudgetWait)
	}
	if c.pc != nil {
		if r := c.s.readyPoll(); r != nil {
			defer r.add(c.pc)()
		}
	}
	t.workers = 1
	t.wg.Add(1)
	t.worker()  // the connection's goroutine is the first worker
	t.wg.Wait() // never close the conn under a running request's reply
	close(c.flushReq)
	<-flusherDone
	return t.err
}

// transmitter is the worker pool of one connection in transmission.
type transmitter struct {
	c    *serverConn
	b    Backend
	name string
	size uint64
	max  int

	readMu  sync.Mutex   // held by the worker that is the reader
	waiting atomic.Int32 // workers waiting to become the reader
	wg      sync.WaitGroup
	share   *clientShare // the client's budgets and turn
	turnLen int64        // requests per turn

	// guarded by readMu
	seenEpoch int64 // the client's turn epoch when this connection last yielded
	workers   int
	stopped   bool
	err       error // why reading stopped (nil after DISC)
}

// worker alternates between reading one request (as the reader) and serving
// it, until reading stops.
func (t *transmitter) worker() {
	defer t.wg.Done()
	for {
		t.waiting.Add(1)
		t.readMu.Lock()
		t.waiting.Add(-1)
		if t.stopped {
			t.readMu.Unlock()
			return
		}
		req, err := t.read()
		if err != nil || req.typ == CmdDisc {
			// DISC: the requests in flight finish, then the connection ends.
			t.stopped, t.err = true, err
			t.readMu.Unlock()
			return
		}
		t.c.active.Add(1)
		if t.waiting.Load() == 0 && t.workers < t.max {
			// Nobody left to read the next request: add a worker. With
			// MaxInFlight workers busy, nobody reads (back-pressure).
			t.workers++
			t.wg.Add(1)
			go t.worker()
		}
		t.readMu.Unlock()
		t.c.serve(t.b, req)
		t.share.bytes.release(payload(req))
		t.share.reqs.release(1)
	}
}

// payload is the memory a request holds while in flight: its WRITE data or
// its READ buffer.
func payload(req request) int64 {
	if req.typ == CmdRead || req.typ == CmdWrite {
		return int64(req.length)
	}
	return 0
}

// clientShare is what one client (the connections of one identity, or one
// connection without identity) may hold: payload bytes and requests in
// flight, and its turn at reading (fair.go).
type clientShare struct {
	bytes, reqs budget
	turn        turn
}

func newClientShare(maxBytes, maxReqs int64, onWait func()) *clientShare {
	sh := &clientShare{}
	sh.bytes.init(maxBytes, onWait)
	sh.reqs.init(maxReqs, nil)
	return sh
}

// identityShare returns the share of the connections of identity id
// (created with maxBytes and maxReqs for its first connection) and the
// function that gives the connection's hold on it back.
func (s *Server) identityShare(id string, maxBytes, maxReqs int64) (*clientShare, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.budgets == nil {
		s.budgets = map[string]*sharedBudget{}
	}
	sb := s.budgets[id]
	if sb == nil {
		sb = &sharedBudget{sh: newClientShare(maxBytes, maxReqs, s.testBudgetWait)}
		s.budgets[id] = sb
	}
	sb.refs++
	return sb.sh, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sb.refs--; sb.refs == 0 {
			delete(s.budgets, id)
		}
	}
}

// sharedBudget is a client share with the number of connections using it.
type sharedBudget struct {
	sh   *clientShare
	refs int
}

// budget is a counting semaphore (of bytes or of requests).
type budget struct {
	mu   sync.Mutex
	cond sync.Cond
	free int64

	onWait func() // if set, called when acquire has to wait (tests)
}

func (b *budget) init(n int64, onWait func()) { b.free, b.onWait = n, onWait; b.cond.L = &b.mu }

// acquire waits until n bytes are free and takes them.
func (b *budget) acquire(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	for b.free < n {
		if b.onWait != nil {
			b.onWait()
		}
		b.cond.Wait()
	}
	b.free -= n
	b.mu.Unlock()
}

// release returns n bytes.
func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// read returns the next request to serve (or DISC); requests that fail
// validation are answered here. readMu held.
func (t *transmitter) read() (request, error) {
	c := t.c
	for {
		t.share.turn.next(c, t.turnLen, &t.seenEpoch)
		var h [28]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return request{}, err
		}
		if m := binary.BigEndian.Uint32(h[0:]); m != requestMagic {
			return request{}, violationf("export %s: bad request magic %#x", t.name, m)
		}
		req := request{
			flags:  binary.BigEndian.Uint16(h[4:]),
			typ:    binary.BigEndian.Uint16(h[6:]),
			handle: binary.BigEndian.Uint64(h[8:]),
			off:    binary.BigEndian.Uint64(h[16:]),
			length: binary.BigEndian.Uint32(h[24:]),
		}
		if req.typ == CmdWrite {
			if req.length > MaxPayloadBytes {
				// The payload cannot be skipped safely: end the connection.
				return request{}, violationf("export %s: WRITE of %d bytes exceeds the maximum %d", t.name, req.length, MaxPayloadBytes)
			}
			// Wait for the requests in flight to free memory rather
			// than buffer more than MaxInFlightBytes for this client.
			t.share.bytes.acquire(int64(req.length))
			req.data = getBuf(int(req.length))
			if _, err := io.ReadFull(c.r, req.data); err != nil {
				putBuf(req.data)
				t.share.bytes.release(int64(req.length))
				return request{}, err
			}
		}
		if req.typ == CmdDisc {
			return req, nil
		}
		if errno := check(req, t.size); errno != 0 {
			putBuf(req.data)
			t.share.bytes.release(int64(len(req.data))) // a WRITE's; 0 for others
			// Sent with the next batch of replies: an invalid request
			// costs no system call of its own.
			if err := c.replyBatched(req.handle, errno); err != nil {
				return request{}, err
			}
			if c.r.Buffered() < 28 {
				// The next read may wait for the client: send what is
				// queued first.
				c.flushSoon()
			}
			continue
		}
		if req.typ == CmdRead {
			t.share.bytes.acquire(int64(req.length))
		}
		// Wait while the client has MaxInFlight requests in flight (over
		// all its connections): it is not read meanwhile.
		c.flushSoon()
		t.share.reqs.acquire(1)
		return req, nil
	}
}

// flusher flushes the reply buffer whenever replies were written, until
// flushReq is closed; then it flushes once more.
func (c *serverConn) flusher(done chan struct{}) {
	defer close(done)
	for range c.flushReq {
		// Let the goroutines that are ready run first: replies that
		// complete together then share one write system call (with
		// GOMAXPROCS=1 the flusher would otherwise run right after each
		// reply and send it alone).
		runtime.Gosched()
		c.wmu.Lock()
		err := c.w.Flush()
		c.wmu.Unlock()
		if err != nil {
			_ = c.rw.Close()
		}
	}
	c.wmu.Lock()
	_ = c.w.Flush()
	c.wmu.Unlock()
}

// check validates a request against the export; 0 means it may proceed.
func check(req request, size uint64) uint32 {
	switch req.typ {
	case CmdRead, CmdWrite, CmdTrim:
		end := req.off + uint64(req.length)
		if end < req.off || end > size {
			if req.typ == CmdWrite {
				return ENOSPC
			}
			return EINVAL
		}
		if req.typ == CmdRead && req.length > MaxPayloadBytes {
			return EOVERFLOW
		}
		return 0
	case CmdFlush:
		if req.off != 0 || req.length != 0 {
			return EINVAL
		}
		return 0
	}
	return EINVAL
}

// serve runs one request on the backend and sends its reply. A panic in the
// backend fails the request with EIO instead of taking the process down.
func (c *serverConn) serve(b Backend, req request) {
	var buf []byte
	errno := uint32(0)
	func() {
		defer func() {
			if r := recover(); r != nil {
				c.s.logf("nbd: backend panic on request type %d: %v", req.typ, r)
				errno = EIO
			}
		}()
		var err error
		switch req.typ {
		case CmdRead:
			buf = getBuf(int(req.length))
			err = b.ReadAt(buf, req.off)
		case CmdWrite:
			err = b.WriteAt(req.data, req.off, req.flags&CmdFlagFUA != 0)
		case CmdFlush:
			err = b.Flush()
		case CmdTrim:
			err = b.Trim(req.off, uint64(req.length))
		default:
			err = &Error{Errno: EINVAL}
		}
		if err != nil {
			errno = errnoOf(err)
		}
	}()
	if errno != 0 {
		buf = nil
	}
	err := c.reply(req.handle, errno, buf)
	c.active.Add(-1)
	putBuf(buf)
	putBuf(req.data)
	if err != nil {
		// The connection is gone; the reader will notice and end.
		_ = c.rw.Close()
	}
}

// Buffers of 4 KiB to 1 MiB are reused across requests, in power-of-two
// size classes.
const (
	minPoolShift = 12
	maxPoolShift = 20
)

var bufPools [maxPoolShift + 1]sync.Pool

func poolClass(n int) int {
	c := minPoolShift
	for 1<<c < n {
		c++
	}
	return c
}

func getBuf(n int) []byte {
	c := poolClass(n)
	if c > maxPoolShift {
		return make([]byte, n)
	}
	if b, ok := bufPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<c)
}

func putBuf(b []byte) {
	c := poolClass(cap(b))
	if c <= maxPoolShift && cap(b) == 1<<c {
		b = b[:cap(b)]
		bufPools[c].Put(&b)
	}
}

// replyBatched queues an error reply without waking the flusher: the
// reader does (flushSoon) before it may wait for the client, before it
// yields at the end of a turn, and whenever it hands on a valid request;
// meanwhile replies that complete send it along.
func (c *serverConn) replyBatched(handle uint64, errno uint32) error {
	return c.replyOpt(handle, errno, nil, true)
}

// flushSoon wakes the flusher if error replies are waiting for it.
func (c *serverConn) flushSoon() {
	if c.unflushed.Swap(false) {
		select {
		case c.flushReq <- struct{}{}:
		default:
		}
	}
}

// reply queues one simple reply (the payload follows only for a good READ)
// and asks the flusher to send it.
func (c *serverConn) reply(handle uint64, errno uint32, data []byte) error {
	return c.replyOpt(handle, errno, data, false)
}

func (c *serverConn) replyOpt(handle uint64, errno uint32, data []byte, batched bool) error {
	var h [16]byte
	binary.BigEndian.PutUint32(h[0:], simpleMagic)
	binary.BigEndian.PutUint32(h[4:], errno)
	binary.BigEndian.PutUint64(h[8:], handle)
	c.wmu.Lock()
	_, err := c.w.Write(h[:])
	if err == nil {
		_, err = c.w.Write(data)
	}
	if err == nil && !batched && c.active.Load() <= 1 {
		// No other request in flight (queue depth 1): send now rather
		// than hand over to the flusher. The reader polls for the
		// next request from before the client can have the reply, and
		// only when no other client can be starved by it
		// (Server.PollNs).
		if c.s.nconns.Load() == 1 {
			activity(c.rw)
		}
		err = c.w.Flush()
		c.wmu.Unlock()
		if err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		return nil
	}
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	if batched {
		c.unflushed.Store(true)
		return nil
	}
	select {
	case c.flushReq <- struct{}{}:
	default: // a flush is already pending and will include this reply
	}
	return nil
}
