package nbd

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Fair service between clients.
//
// With GOMAXPROCS=1 (sluice gateway's --cpus 1) the Go scheduler looks at
// the sockets whose readers wait in its netpoller only when it has no
// runnable goroutine, or every 10 ms (sysmon). A client that keeps the
// server busy (256 requests pipelined, valid or not) therefore keeps every
// other client's requests unread: they arrive, and nobody notices them.
// Three rules bound what one client gets:
//
//   - A turn: a client (all connections of one identity, or one
//     connection without identity) reads at most TurnRequests (8) requests,
//     answered or invalid alike, then its reader yields: it asks the
//     kernel which other connections have requests waiting (one
//     epoll_wait on a level-triggered set of every connection in
//     transmission), wakes the readers of those parked in the netpoller,
//     and lets the runnable goroutines run before it reads on. It keeps
//     its connection's reader role meanwhile, so its own finished
//     workers wait instead of reading more; the readers of the client's
//     other connections yield once per turn too.
//   - In flight: the connections of one identity share
//     MaxInFlightPerIdentity requests in flight (as they share
//     MaxInFlightBytes), so more connections buy a client neither more
//     memory nor more workers; a client without identity has MaxInFlight
//     per connection.
//   - Error replies are sent with the next batch of replies, not with
//     one system call each.

// DefaultTurnRequests is Server.TurnRequests's default. Measured
// (TestLiveHostileVM, medians of three rounds): a VM pipelining valid
// READs left the other VM 41% of its IOPS alone with turns of 16, 51–74%
// with 8 (six runs), 66% with 4 (one run); a turn's end costs one
// epoll_wait and a yield.
const DefaultTurnRequests = 8

// DefaultMaxInFlightPerIdentity is Server.MaxInFlightPerIdentity's
// default: twice QEMU's NBD client's 16 requests per connection, so that a
// VM still keeps a slow datastore busy. In TestLiveHostileVM (turns of 16)
// 16 and 32 were within the run-to-run noise of each other (medians 46%
// and 41%), and 128 was clearly worse (single runs: 31% and 44%).
const DefaultMaxInFlightPerIdentity = 32

// readyPoll is a level-triggered epoll set of the server's connections in
// transmission; a reader at the end of its turn asks it which connections
// have data waiting and wakes their parked readers.
type readyPoll struct {
	epfd int

	mu    sync.Mutex
	conns map[int32]*pollConn // by registration token
	next  int32
}

func newReadyPoll() (*readyPoll, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &readyPoll{epfd: fd, conns: map[int32]*pollConn{}}, nil
}

// add registers p; the returned function removes it (before p closes).
func (r *readyPoll) add(p *pollConn) func() {
	r.mu.Lock()
	r.next++
	if r.next <= 0 {
		r.next = 1
	}
	tok := r.next
	r.conns[tok] = p
	r.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: tok}
	var added bool
	_ = p.rc.Control(func(fd uintptr) {
		added = syscall.EpollCtl(r.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) == nil
	})
	return func() {
		if added {
			// Control runs only while the descriptor is open, so a
			// descriptor number reused by a newer connection is never
			// removed by mistake (a closed one left the set by itself).
			_ = p.rc.Control(func(fd uintptr) {
				_ = syscall.EpollCtl(r.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
			})
		}
		r.mu.Lock()
		delete(r.conns, tok)
		r.mu.Unlock()
	}
}

// kickReady wakes the parked readers of the connections (other than self)
// that have data waiting.
func (r *readyPoll) kickReady(self *pollConn) {
	var evs [64]syscall.EpollEvent
	n, err := syscall.EpollWait(r.epfd, evs[:], 0)
	if err != nil || n <= 0 {
		return
	}
	r.mu.Lock()
	var ps [64]*pollConn
	k := 0
	for _, ev := range evs[:n] {
		if p := r.conns[ev.Fd]; p != nil && p != self {
			ps[k] = p
			k++
		}
	}
	r.mu.Unlock()
	for _, p := range ps[:k] {
		p.kick()
	}
}

// kick wakes the reader if it is parked in the netpoller; it then reads
// again (see Read).
func (p *pollConn) kick() {
	if p.parked.Load() && !p.kicked.Swap(true) {
		_ = p.Conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// readyPoll returns the server's readyPoll (nil if epoll is unavailable).
func (s *Server) readyPoll() *readyPoll {
	s.readyOnce.Do(func() {
		r, err := newReadyPoll()
		if err != nil {
			s.logf("nbd: epoll for fair service: %v (clients are not woken at the end of another's turn)", err)
			return
		}
		s.ready = r
	})
	return s.ready
}

// closeReadyPoll releases the epoll descriptor (Close).
func (s *Server) closeReadyPoll() {
	s.readyOnce.Do(func() {})
	if s.ready != nil {
		_ = syscall.Close(s.ready.epfd)
	}
}

// turn counts the requests a client read; every turnLen-th read ends its
// turn, and epoch counts the ends, so that every reader of the client
// (one per connection) yields once per turn, not only the one that read
// the last request of the turn.
type turn struct {
	n, epoch atomic.Int64
}

// next counts one request read by a reader that last yielded at epoch
// *seen: it yields if the turn ended now (end of turn, waking the others)
// or ended since it last yielded (another reader of the client ended it).
func (t *turn) next(c *serverConn, turnLen int64, seen *int64) {
	if t.n.Add(1)%turnLen == 0 {
		*seen = t.epoch.Add(1)
		c.endOfTurn()
		return
	}
	if e := t.epoch.Load(); e != *seen {
		*seen = e
		c.flushSoon()
		runtime.Gosched()
	}
}

// endOfTurn yields the reader of connection c at the end of its client's
// turn: the readers of other connections with data waiting are woken, and
// the runnable goroutines run before c reads on.
func (c *serverConn) endOfTurn() {
	c.flushSoon()
	if c.pc != nil && c.s.ready != nil {
		c.s.ready.kickReady(c.pc)
	}
	runtime.Gosched()
}
