package nbd

import (
	"bufio"
	"crypto/tls"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Backend is one exported block device. Its methods may be called from many
// goroutines at once; each call returns only when the operation is complete
// (for WriteAt: acknowledged by whatever stores the data; with fua: durable).
type Backend interface {
	// SizeBytes is the size of the export.
	SizeBytes() uint64
	ReadAt(p []byte, off uint64) error
	WriteAt(p []byte, off uint64, fua bool) error
	// Flush returns when every write completed before the call is durable.
	Flush() error
	Trim(off, lengthBytes uint64) error
}

// Attacher is a Backend that learns which connections use it: Attach is
// called when a connection has chosen it (false: the export is gone, and
// the connection is closed), Detach when that connection ends.
type Attacher interface {
	Attach() bool
	Detach()
}

// Exports resolves export names to backends.
type Exports interface {
	// Export returns the backend named name, or false.
	Export(name string) (Backend, bool)
	// Names lists the exports (for NBD_OPT_LIST).
	Names() []string
}

// MapExports is a fixed set of exports.
type MapExports map[string]Backend

// Export implements Exports.
func (m MapExports) Export(name string) (Backend, bool) { b, ok := m[name]; return b, ok }

// Names implements Exports.
func (m MapExports) Names() []string {
	n := make([]string, 0, len(m))
	for k := range m {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Access is what the connections accepted on one listener may do
// (Server.ServeAccess).
type Access struct {
	// Identity is the identity of every connection on the listener (e.g.
	// the VM whose Unix socket it is). After NBD_OPT_STARTTLS, the Common
	// Name of a verified client certificate replaces it.
	Identity string
	// Allow, if set, reports whether a connection with identity id may
	// list and open export; nil allows every export. An export not allowed
	// is answered exactly like one that does not exist
	// (NBD_REP_ERR_UNKNOWN, absent from NBD_OPT_LIST), so that a client
	// cannot probe for other clients' export names.
	Allow func(id, export string) bool
	// TLS, if set, makes TLS mandatory on the listener: the server offers
	// NBD_OPT_STARTTLS with this configuration and answers every other
	// option before it (but NBD_OPT_ABORT) with NBD_REP_ERR_TLS_REQD;
	// NBD_OPT_EXPORT_NAME, which has no error reply, closes the
	// connection. Without TLS, NBD_OPT_STARTTLS gets NBD_REP_ERR_UNSUP.
	TLS *tls.Config
	// MaxConns bounds the listener's open connections (0: only the
	// server's MaxConns). A connection beyond it is closed at once.
	MaxConns int
	// MaxUnauthenticated bounds the listener's connections that have not
	// authenticated (with TLS: not yet presented a verified client
	// certificate naming an identity); MaxUnauthenticatedPerSource those
	// of one remote IP address. When a bound is reached the oldest such
	// connection (of that address, or of all) is closed to make room
	// (pending.go). 0: no bound. Only meaningful with TLS: without it no
	// connection authenticates.
	MaxUnauthenticated, MaxUnauthenticatedPerSource int
	// MaxConnsPerIdentity, if > 0, bounds the connections of one identity
	// learnt from a TLS client certificate on this listener: one more is
	// closed when its TLS handshake ends, so that one VM's certificate
	// cannot take the listener's places from the others.
	MaxConnsPerIdentity int
	perID               *identityConns // set by ServeAccess when MaxConnsPerIdentity > 0
	// AuthTimeout, if > 0, is how long a connection may take to
	// authenticate (the TLS handshake included); after that the rest of
	// the handshake has the server's HandshakeTimeout.
	AuthTimeout time.Duration
}

// DefaultMaxConns is Server.MaxConns's default.
const DefaultMaxConns = 1024

// IdleConnBytes is the stated memory bound of one open, idle connection
// after the handshake, Go heap and stacks: 64 KiB read and 64 KiB write
// buffers, the connection's two goroutines (reader/worker and flusher) and
// its bookkeeping (TestIdleConnectionsMemory measures it). Requests in
// flight add their payload, bounded by MaxInFlightBytes.
const IdleConnBytes = 160 << 10

// Server serves NBD exports. The zero value is not usable: set Exports.
type Server struct {
	// Exports are the devices served.
	Exports Exports
	// MaxConns bounds the connections accepted by Serve and ServeAccess
	// and open at once, over all listeners (default DefaultMaxConns). A
	// connection beyond it is closed at once, before the NBD greeting (the
	// client reads end of file); refusals are logged at most once a
	// second and counted (Refused).
	MaxConns int
	// MaxInFlight bounds the requests of one connection being processed at
	// once (default 128); the server stops reading the connection's requests
	// while it is reached.
	MaxInFlight int
	// MaxInFlightPerIdentity bounds the requests in flight of all the
	// connections of one identity (a VM, on a listener with Access.Allow)
	// together (default DefaultMaxInFlightPerIdentity): a request in
	// flight is a goroutine that wants the CPU, so this bounds how much of
	// the server's run queue one client fills, and more connections do
	// not buy it more.
	MaxInFlightPerIdentity int
	// TurnRequests is how many requests (valid or not) a client reads
	// before its reader yields to the other clients (default
	// DefaultTurnRequests; see fair.go). The connections of one identity
	// share a turn.
	TurnRequests int
	// MaxInFlightBytes bounds the payload bytes of one connection's
	// requests in flight: WRITE data read and READ buffers (default 64 MiB,
	// at least MaxPayloadBytes). The server stops reading the connection's
	// requests until enough of them finished, so a client cannot make the
	// server hold more than this for it (128 requests of 32 MiB would
	// otherwise be 4 GiB). On a listener with Access.Allow, the
	// connections of one identity (a VM) share one such budget.
	MaxInFlightBytes int64
	testBudgetWait   func() // called when a reader waits for MaxInFlightBytes (tests)
	// HandshakeTimeout bounds the whole handshake (default 10 s).
	HandshakeTimeout time.Duration
	// Logf receives one line per protocol violation or closed connection
	// (nil: silent).
	Logf func(format string, args ...any)
	// PollNs, if > 0, makes a connection's reader poll its socket for up to
	// PollNs for the next request after a reply was sent with no other
	// request in flight, before parking (bounded busy polling: CPU for
	// latency; see pollConn). It applies to net.Conn connections, and only
	// while the server has a single connection: while a goroutine polls,
	// Go's scheduler does not look at the other sockets (sysmon does, every
	// 10 ms), so a client whose requests keep a poller busy would delay
	// every other client's (measured in docs/perf/storage.md).
	PollNs int64

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[io.Closer]struct{}
	nconns    atomic.Int32 // len(conns), read without mu (polling)
	closed    bool
	wg        sync.WaitGroup

	budgets     map[string]*sharedBudget // per identity, while it has connections (mu)
	readyOnce   sync.Once
	ready       *readyPoll   // connections in transmission (nil: no epoll)
	open        atomic.Int32 // connections accepted and not yet ended
	refused     atomic.Uint64
	lastRefusal atomic.Int64 // monoNs of the last refusal logged
	displaced   atomic.Uint64
	lastDisplay atomic.Int64 // monoNs of the last displacement logged

	lastHandshakeLog  atomic.Int64  // monoNs of the last failed handshake logged
	handshakeFailures atomic.Uint64 // failed handshakes not logged since
}

// onceASecond reports whether a second has passed since it last returned
// true for last (a monoNs time; 0: never), and if so records now.
func onceASecond(last *atomic.Int64) bool {
	now := monoNs() + 1 // never 0
	l := last.Load()
	if l != 0 && now-l < int64(time.Second) {
		return false
	}
	return last.CompareAndSwap(l, now)
}

// Refused is the number of connections closed at once because a
// connection cap (Server.MaxConns, Access.MaxConns) was reached.
func (s *Server) Refused() uint64 { return s.refused.Load() }

// Displaced is the number of unauthenticated connections closed to make
// room for newer ones (Access.MaxUnauthenticated, ...PerSource).
func (s *Server) Displaced() uint64 { return s.displaced.Load() }

// admit takes a place for a new connection of a listener that has mine
// open (bound max, 0: none); false if a cap is reached.
func (s *Server) admit(mine *atomic.Int32, max int) bool {
	total := s.MaxConns
	if total <= 0 {
		total = DefaultMaxConns
	}
	n := s.open.Add(1)
	m := mine.Add(1)
	if int(n) <= total && (max <= 0 || int(m) <= max) {
		return true
	}
	s.open.Add(-1)
	mine.Add(-1)
	s.refused.Add(1)
	if onceASecond(&s.lastRefusal) {
		if int(n) > total {
			s.logf("nbd: connection refused: %d connections open (limit %d)", n-1, total)
		} else {
			s.logf("nbd: connection refused: %d connections open on this listener (limit %d)", m-1, max)
		}
	}
	return false
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// Serve accepts connections on l until l fails or the server is closed;
// every connection may open every export.
func (s *Server) Serve(l net.Listener) error { return s.ServeAccess(l, Access{}) }

// ServeAccess accepts connections on l until l fails (its error) or the
// server is closed (nil; l is closed then, also when the server was closed
// before); a connection may do what a allows.
func (s *Server) ServeAccess(l net.Listener, a Access) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = l.Close() // as if it had been open when the server closed
		return nil
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() { s.mu.Lock(); delete(s.listeners, l); s.mu.Unlock() }()
	var mine atomic.Int32 // this listener's open connections
	if a.MaxConnsPerIdentity > 0 {
		a.perID = &identityConns{max: a.MaxConnsPerIdentity, n: map[string]int{}}
	}
	var pending *pendingSet
	if a.MaxUnauthenticated > 0 || a.MaxUnauthenticatedPerSource > 0 {
		pending = newPendingSet(a.MaxUnauthenticated, a.MaxUnauthenticatedPerSource)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !s.admit(&mine, a.MaxConns) {
			_ = c.Close()
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		var onAuth, onStartTLS func()
		if pending != nil {
			pc, displaced := pending.add(c)
			for _, o := range displaced {
				_ = o.c.Close()
			}
			if n := len(displaced); n > 0 {
				s.displaced.Add(uint64(n))
				if onceASecond(&s.lastDisplay) {
					s.logf("nbd: closed %d unauthenticated connection(s) to make room (%d unauthenticated open, limits %d, %d per address; %d closed so far)",
						n, pending.len(), a.MaxUnauthenticated, a.MaxUnauthenticatedPerSource, s.displaced.Load())
				}
			}
			onAuth = func() { pending.remove(pc) }
			onStartTLS = func() { pending.startedTLS(pc) }
		}
		s.wg.Add(1)
		go func() {
			defer func() { s.open.Add(-1); mine.Add(-1); s.wg.Done() }()
			if onAuth != nil {
				defer onAuth()
			}
			s.serveConn(c, a, onAuth, onStartTLS)
		}()
	}
}

// Close stops the listeners, closes every connection and waits for their
// requests to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		_ = l.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.closeReadyPoll()
	return nil
}

// ServeConn runs the protocol on one connection until the client leaves or
// breaks the protocol; it closes rw before returning. The connection may
// open every export.
func (s *Server) ServeConn(rw io.ReadWriteCloser) { s.ServeConnAccess(rw, Access{}) }

// ServeConnAccess is ServeConn for a connection that may do what a allows.
func (s *Server) ServeConnAccess(rw io.ReadWriteCloser, a Access) { s.serveConn(rw, a, nil, nil) }

// serveConn is ServeConnAccess; onAuth and onStartTLS, if set, are called
// when the connection authenticated and when it asked for TLS.
func (s *Server) serveConn(rw io.ReadWriteCloser, a Access, onAuth, onStartTLS func()) {
	if nc, ok := rw.(net.Conn); ok {
		rw = newPollConn(nc, s.PollNs)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = rw.Close()
		return
	}
	if s.conns == nil {
		s.conns = map[io.Closer]struct{}{}
	}
	s.conns[rw] = struct{}{}
	s.nconns.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, rw)
		s.nconns.Add(-1)
		s.mu.Unlock()
		_ = rw.Close()
	}()
	// Small buffers during the handshake: a connection that never gets
	// past it (or waits in it) costs little memory.
	c := &serverConn{s: s, acc: &a, id: a.Identity, rw: rw, r: bufio.NewReaderSize(rw, handshakeBufBytes), w: bufio.NewWriterSize(rw, handshakeBufBytes)}
	c.pc, _ = rw.(*pollConn)
	c.onAuth, c.onStartTLS = onAuth, onStartTLS
	err := c.run()
	if c.releaseID != nil {
		c.releaseID()
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return
	}
	if c.transmitting {
		s.logf("nbd: connection closed: %v", err)
		return
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return // a client that connected and left (a probe): nothing to say
	}
	// Handshakes that fail are logged at most once a second: anybody who
	// can reach a listener can fail them.
	if onceASecond(&s.lastHandshakeLog) {
		more := ""
		if n := s.handshakeFailures.Swap(0); n > 0 {
			more = fmt.Sprintf(" (and %d more since the last such line)", n)
		}
		s.logf("nbd: connection closed in the handshake (%s): %v%s", c.who(), err, more)
	} else {
		s.handshakeFailures.Add(1)
	}
}

// handshakeBufBytes and transmitBufBytes are the sizes of a connection's
// read and write buffers during the handshake and in transmission.
const (
	handshakeBufBytes = 4 << 10
	transmitBufBytes  = 64 << 10
)

type serverConn struct {
	s     *Server
	acc   *Access
	id    string // the client's identity (Access.Identity or its certificate's)
	tlsOn bool   // NBD_OPT_STARTTLS succeeded
	// transmitting: the handshake is over
	transmitting bool
	rw           io.ReadWriteCloser
	pc           *pollConn // the socket under rw (and under TLS), if it is one
	onAuth       func()    // called once the client authenticated (nil: nobody cares)
	onStartTLS   func()    // called when the client asks for TLS (nil: nobody cares)
	releaseID    func()    // gives back the place held in Access.MaxConnsPerIdentity (nil: none)
	r            *bufio.Reader
	w            *bufio.Writer

	wmu       sync.Mutex    // guards w during transmission
	flushReq  chan struct{} // a reply is waiting in w (capacity 1)
	active    atomic.Int32  // requests handed to workers and not yet answered
	unflushed atomic.Bool   // error replies queued without waking the flusher
	noZeroes  bool
}

// violation is a protocol error that ends the connection.
type violation struct{ msg string }

func (v *violation) Error() string { return "protocol violation: " + v.msg }

func violationf(format string, args ...any) error {
	return &violation{msg: fmt.Sprintf(format, args...)}
}

func (c *serverConn) run() error {
	timeout := c.s.HandshakeTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	nc, isNet := c.rw.(net.Conn)
	if isNet {
		first := timeout
		if c.acc.AuthTimeout > 0 && c.acc.AuthTimeout < first {
			first = c.acc.AuthTimeout
		}
		_ = nc.SetDeadline(time.Now().Add(first))
	}
	b, name, err := c.handshake()
	if err != nil || b == nil {
		return err
	}
	if a, ok := b.(Attacher); ok {
		if !a.Attach() {
			return fmt.Errorf("export %q is no longer served", name)
		}
		defer a.Detach()
	}
	if isNet {
		_ = nc.SetDeadline(time.Time{})
	}
	c.transmitting = true
	// Every handshake reply was flushed; data the client sent after
	// NBD_OPT_GO stays in the small reader.
	if c.r.Buffered() == 0 {
		c.r = bufio.NewReaderSize(c.rw, transmitBufBytes)
	}
	c.w = bufio.NewWriterSize(c.rw, transmitBufBytes)
	return c.transmission(b, name)
}

func (c *serverConn) handshake() (Backend, string, error) {
	var hdr [18]byte
	binary.BigEndian.PutUint64(hdr[0:], nbdMagic)
	binary.BigEndian.PutUint64(hdr[8:], optMagic)
	binary.BigEndian.PutUint16(hdr[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.w.Write(hdr[:]); err != nil {
		return nil, "", err
	}
	if err := c.w.Flush(); err != nil {
		return nil, "", err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.r, cf[:]); err != nil {
		return nil, "", err
	}
	cflags := binary.BigEndian.Uint32(cf[:])
	if cflags&^uint32(flagFixedNewstyle|flagNoZeroes) != 0 {
		return nil, "", violationf("unknown client flags %#x", cflags)
	}
	c.noZeroes = cflags&flagNoZeroes != 0
	for nopt := 0; ; nopt++ {
		if nopt == maxOptions {
			return nil, "", violationf("more than %d options", maxOptions)
		}
		var oh [16]byte
		if _, err := io.ReadFull(c.r, oh[:]); err != nil {
			return nil, "", err
		}
		if m := binary.BigEndian.Uint64(oh[0:]); m != optMagic {
			return nil, "", violationf("bad option magic %#x", m)
		}
		opt := binary.BigEndian.Uint32(oh[8:])
		n := binary.BigEndian.Uint32(oh[12:])
		if n > maxOptionBytes {
			return nil, "", violationf("option %d: payload of %d bytes is too large", opt, n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return nil, "", err
		}
		if c.acc.TLS != nil && !c.tlsOn && opt != optStartTLS && opt != optAbort {
			if opt == optExportName {
				return nil, "", violationf("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS (TLS is required)")
			}
			if err := c.optErr(opt, repErrTLSReqd, "TLS is required: send NBD_OPT_STARTTLS first"); err != nil {
				return nil, "", err
			}
			continue
		}
		switch opt {
		case optStartTLS:
			if err := c.startTLS(n); err != nil {
				return nil, "", err
			}
		case optExportName:
			b, ok := c.lookup(string(data))
			if !ok {
				return nil, "", violationf("NBD_OPT_EXPORT_NAME: no export %q for %s", data, c.who())
			}
			var rep [10 + 124]byte
			binary.BigEndian.PutUint64(rep[0:], b.SizeBytes())
			binary.BigEndian.PutUint16(rep[8:], transmitFlagsRW)
			out := rep[:]
			if c.noZeroes {
				out = rep[:10]
			}
			if _, err := c.w.Write(out); err != nil {
				return nil, "", err
			}
			return b, string(data), c.w.Flush()
		case optAbort:
			_ = c.optReply(opt, repAck, nil)
			_ = c.w.Flush()
			return nil, "", nil
		case optList:
			if n != 0 {
				if err := c.optErr(opt, repErrInvalid, "NBD_OPT_LIST takes no data"); err != nil {
					return nil, "", err
				}
				continue
			}
			for _, name := range c.s.Exports.Names() {
				if !c.allowed(name) {
					continue
				}
				p := make([]byte, 4+len(name))
				binary.BigEndian.PutUint32(p, uint32(len(name)))
				copy(p[4:], name)
				if err := c.optReply(opt, repServer, p); err != nil {
					return nil, "", err
				}
			}
			if err := c.optReply(opt, repAck, nil); err != nil {
				return nil, "", err
			}
		case optInfo, optGo:
			b, name, msg := c.parseInfo(data)
			if msg != "" {
				code := uint32(repErrInvalid)
				if b == nil && name != "" {
					code = repErrUnknown
				}
				if err := c.optErr(opt, code, msg); err != nil {
					return nil, "", err
				}
				continue
			}
			var info [12]byte
			binary.BigEndian.PutUint16(info[0:], infoExport)
			binary.BigEndian.PutUint64(info[2:], b.SizeBytes())
			binary.BigEndian.PutUint16(info[10:], transmitFlagsRW)
			var bs [14]byte
			binary.BigEndian.PutUint16(bs[0:], infoBlockSize)
			binary.BigEndian.PutUint32(bs[2:], 1)
			binary.BigEndian.PutUint32(bs[6:], 4096)
			binary.BigEndian.PutUint32(bs[10:], MaxPayloadBytes)
			if err := c.optReply(opt, repInfo, info[:]); err != nil {
				return nil, "", err
			}
			if err := c.optReply(opt, repInfo, bs[:]); err != nil {
				return nil, "", err
			}
			if err := c.optReply(opt, repAck, nil); err != nil {
				return nil, "", err
			}
			if opt == optGo {
				return b, name, nil
			}
		default:
			if err := c.optErr(opt, repErrUnsup, fmt.Sprintf("option %d is not supported", opt)); err != nil {
				return nil, "", err
			}
		}
	}
}

// parseInfo decodes an NBD_OPT_INFO/GO payload; msg is non-empty on error.
func (c *serverConn) parseInfo(data []byte) (b Backend, name string, msg string) {
	if len(data) < 6 {
		return nil, "", "NBD_OPT_GO/INFO: payload too short"
	}
	nl := binary.BigEndian.Uint32(data)
	if uint64(nl)+6 > uint64(len(data)) {
		return nil, "", "NBD_OPT_GO/INFO: name length beyond payload"
	}
	name = string(data[4 : 4+nl])
	nreq := binary.BigEndian.Uint16(data[4+nl:])
	if int(4+nl+2)+2*int(nreq) != len(data) {
		return nil, "", "NBD_OPT_GO/INFO: information request count does not match payload"
	}
	b, ok := c.lookup(name)
	if !ok {
		return nil, name, fmt.Sprintf("no export named %q", name)
	}
	return b, name, ""
}

// allowed reports whether the client may list and open export name.
func (c *serverConn) allowed(name string) bool {
	return c.acc.Allow == nil || c.acc.Allow(c.id, name)
}

// lookup returns the export named name if the client may open it.
func (c *serverConn) lookup(name string) (Backend, bool) {
	if !c.allowed(name) {
		return nil, false
	}
	return c.s.Exports.Export(name)
}

// who names the client in log lines.
func (c *serverConn) who() string {
	if c.id == "" {
		return "a client without identity"
	}
	return fmt.Sprintf("client %q", c.id)
}

// startTLS answers NBD_OPT_STARTTLS (payload of n bytes, already read):
// it acknowledges, runs the TLS handshake as server, and from then on the
// connection speaks through TLS. A failed TLS handshake ends the
// connection.
func (c *serverConn) startTLS(n uint32) error {
	switch {
	case c.acc.TLS == nil:
		return c.optErr(optStartTLS, repErrUnsup, "TLS is not offered here")
	case c.tlsOn:
		return c.optErr(optStartTLS, repErrInvalid, "TLS is already on")
	case n != 0:
		return c.optErr(optStartTLS, repErrInvalid, "NBD_OPT_STARTTLS takes no data")
	}
	if c.onStartTLS != nil {
		c.onStartTLS()
	}
	if err := c.optReply(optStartTLS, repAck, nil); err != nil {
		return err
	}
	if c.r.Buffered() != 0 {
		return violationf("data after NBD_OPT_STARTTLS before the TLS handshake")
	}
	nc, ok := c.rw.(net.Conn)
	if !ok {
		nc = streamConn{c.rw}
	}
	tc := tls.Server(nc, c.acc.TLS)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.tlsOn = true
	if cs := tc.ConnectionState(); len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
		c.id = certIdentity(cs.VerifiedChains[0][0].Subject)
	}
	if c.id != "" && c.acc.perID != nil {
		release, ok := c.acc.perID.hold(c.id)
		if !ok {
			c.s.refused.Add(1)
			return fmt.Errorf("client %q has %d connections on this listener (limit %d)", c.id, c.acc.MaxConnsPerIdentity, c.acc.MaxConnsPerIdentity)
		}
		c.releaseID = release
	}
	if c.id != "" && c.onAuth != nil {
		c.onAuth()
		if c.acc.AuthTimeout > 0 {
			// Authenticated: the rest of the handshake has the usual time.
			timeout := c.s.HandshakeTimeout
			if timeout == 0 {
				timeout = 10 * time.Second
			}
			_ = nc.SetDeadline(time.Now().Add(timeout))
		}
	}
	c.rw = tc
	c.r = bufio.NewReaderSize(tc, handshakeBufBytes)
	c.w = bufio.NewWriterSize(tc, handshakeBufBytes)
	return nil
}

// oidCommonName is the X.509 attribute type of a common name.
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// certIdentity is the client's identity from its certificate's subject:
// its one common name. A subject with several common names is ambiguous
// (Go keeps the last, another reader the first): it has no identity, and
// opens no export.
func certIdentity(subject pkix.Name) string {
	n := 0
	for _, a := range subject.Names {
		if a.Type.Equal(oidCommonName) {
			n++
		}
	}
	if n != 1 {
		return ""
	}
	return subject.CommonName
}

// streamConn gives a plain byte stream the net.Conn methods TLS needs
// (ServeConn on something that is not a socket: tests, the fuzzer).
type streamConn struct{ io.ReadWriteCloser }

type streamAddr struct{}

func (streamAddr) Network() string { return "stream" }
func (streamAddr) String() string  { return "stream" }

func (streamConn) LocalAddr() net.Addr                { return streamAddr{} }
func (streamConn) RemoteAddr() net.Addr               { return streamAddr{} }
func (streamConn) SetDeadline(t time.Time) error      { return nil }
func (streamConn) SetReadDeadline(t time.Time) error  { return nil }
func (streamConn) SetWriteDeadline(t time.Time) error { return nil }

func (c *serverConn) optReply(opt, typ uint32, data []byte) error {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], optReplyMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], typ)
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	if _, err := c.w.Write(h[:]); err != nil {
		return err
	}
	if _, err := c.w.Write(data); err != nil {
		return err
	}
	return c.w.Flush()
}

func (c *serverConn) optErr(opt, typ uint32, msg string) error {
	return c.optReply(opt, typ, []byte(msg))
}
