package nbd

import (
	"container/list"
	"net"
	"sync"
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
// authenticate is short (Access.AuthTimeout). A connection is
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
	c    net.Conn
	src  string
	elem *list.Element // nil once removed
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
		for e := p.order.Front(); e != nil; e = e.Next() {
			if o := e.Value.(*pendingConn); o.src == pc.src {
				p.removeLocked(o)
				out = append(out, o)
				break
			}
		}
	}
	if p.maxTotal > 0 && p.order.Len() >= p.maxTotal {
		o := p.order.Front().Value.(*pendingConn)
		p.removeLocked(o)
		out = append(out, o)
	}
	pc.elem = p.order.PushBack(pc)
	p.bySrc[pc.src]++
	return pc, out
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
