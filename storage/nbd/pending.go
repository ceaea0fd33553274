package nbd

import (
	"container/list"
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// Connections that have not authenticated yet.
//
// On a TLS listener anybody who reaches the port can open connections and
// hold them in the handshake. Such connections are bounded apart from the
// authenticated ones (Access.MaxUnauthenticated, ...PerSource): when a
// bound is reached, the oldest unauthenticated connection (of that source,
// or of all) is closed to make room for the new one, so that a client with
// a valid certificate, whose handshake takes milliseconds, still gets in
// while strangers hold hundreds of idle connections; and the time to
// authenticate is short (Access.AuthTimeout). Idle connections go first:
// those that have not asked for TLS (NBD_OPT_STARTTLS) and have no bytes
// waiting to be read; then those with bytes waiting (the server has not
// got to them yet); a client in its TLS handshake, which may take a while
// on a loaded server, last. A connection is
// authenticated once its TLS handshake verified a client certificate that
// names an identity.

// pendingSet is one listener's unauthenticated connections, oldest first.
type pendingSet struct {
	maxTotal, maxPerSource int

	mu    sync.Mutex
	order list.List // of *pendingConn
	bySrc map[string]int
}

// pendingConn is one unauthenticated connection in a pendingSet.
type pendingConn struct {
	c     net.Conn
	src   string
	elem  *list.Element // nil once removed
	inTLS bool          // asked for TLS (guarded by the set's mu)
}

func newPendingSet(maxTotal, maxPerSource int) *pendingSet {
	return &pendingSet{maxTotal: maxTotal, maxPerSource: maxPerSource, bySrc: map[string]int{}}
}

// sourceOf is the address a connection's bound per source applies to: the
// remote IP (any port), or "" for connections without one.
func sourceOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}

// add records c as unauthenticated and returns the connections it
// displaces (the oldest of its source over maxPerSource, then the oldest
// over maxTotal), which the caller closes.
func (p *pendingSet) add(c net.Conn) (*pendingConn, []*pendingConn) {
	pc := &pendingConn{c: c, src: sourceOf(c)}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*pendingConn
	if p.maxPerSource > 0 && p.bySrc[pc.src] >= p.maxPerSource {
		if o := p.oldestLocked(pc.src, true); o != nil {
			p.removeLocked(o)
			out = append(out, o)
		}
	}
	if p.maxTotal > 0 && p.order.Len() >= p.maxTotal {
		if o := p.oldestLocked("", false); o != nil {
			p.removeLocked(o)
			out = append(out, o)
		}
	}
	pc.elem = p.order.PushBack(pc)
	p.bySrc[pc.src]++
	return pc, out
}

// oldestLocked is the connection to displace: the oldest (of source src
// if bySrc) that is idle, else the oldest with bytes waiting, else the
// oldest. p.mu held.
func (p *pendingSet) oldestLocked(src string, bySrc bool) *pendingConn {
	var waiting, inTLS *pendingConn
	for e := p.order.Front(); e != nil; e = e.Next() {
		o := e.Value.(*pendingConn)
		switch {
		case bySrc && o.src != src:
		case o.inTLS:
			if inTLS == nil {
				inTLS = o
			}
		case unreadBytes(o.c) > 0:
			if waiting == nil {
				waiting = o
			}
		default:
			return o
		}
	}
	if waiting != nil {
		return waiting
	}
	return inTLS
}

// unreadBytes is how many bytes wait in c's socket (FIONREAD; 0 when it
// cannot tell).
func unreadBytes(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	_ = rc.Control(func(fd uintptr) {
		_, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		if e != 0 {
			n = 0
		}
	})
	return int(n)
}

// startedTLS records that pc asked for TLS: it is displaced after those
// that did not.
func (p *pendingSet) startedTLS(pc *pendingConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc.inTLS = true
}

// remove forgets pc (authenticated or ended); removing twice is harmless.
func (p *pendingSet) remove(pc *pendingConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(pc)
}

func (p *pendingSet) removeLocked(pc *pendingConn) {
	if pc.elem == nil {
		return
	}
	p.order.Remove(pc.elem)
	pc.elem = nil
	if p.bySrc[pc.src]--; p.bySrc[pc.src] <= 0 {
		delete(p.bySrc, pc.src)
	}
}

// len is the number of unauthenticated connections.
func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.order.Len()
}

// identityConns counts one listener's connections per TLS identity
// (Access.MaxConnsPerIdentity).
type identityConns struct {
	mu  sync.Mutex
	max int
	n   map[string]int
}

// hold takes a place for a connection of identity id; false if none is
// free. The function returned gives it back.
func (ic *identityConns) hold(id string) (func(), bool) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.n[id] >= ic.max {
		return nil, false
	}
	ic.n[id]++
	return func() {
		ic.mu.Lock()
		defer ic.mu.Unlock()
		if ic.n[id]--; ic.n[id] <= 0 {
			delete(ic.n, id)
		}
	}, true
}
