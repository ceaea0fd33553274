package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
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

// Server serves NBD exports. The zero value is not usable: set Exports.
type Server struct {
	// Exports are the devices served.
	Exports Exports
	// MaxInFlight bounds the requests of one connection being processed at
	// once (default 128); the server stops reading the connection's requests
	// while it is reached.
	MaxInFlight int
	// MaxInFlightBytes bounds the payload bytes of one connection's
	// requests in flight: WRITE data read and READ buffers (default 64 MiB,
	// at least MaxPayloadBytes). The server stops reading the connection's
	// requests until enough of them finished, so a client cannot make the
	// server hold more than this for it (128 requests of 32 MiB would
	// otherwise be 4 GiB).
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
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// Serve accepts connections on l until l fails or the server is closed.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() { s.mu.Lock(); delete(s.listeners, l); s.mu.Unlock() }()
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
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.ServeConn(c) }()
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
	return nil
}

// ServeConn runs the protocol on one connection until the client leaves or
// breaks the protocol; it closes rw before returning.
func (s *Server) ServeConn(rw io.ReadWriteCloser) {
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
	c := &serverConn{s: s, rw: rw, r: bufio.NewReaderSize(rw, 64<<10), w: bufio.NewWriterSize(rw, 64<<10)}
	if err := c.run(); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.logf("nbd: connection closed: %v", err)
	}
}

type serverConn struct {
	s  *Server
	rw io.ReadWriteCloser
	r  *bufio.Reader
	w  *bufio.Writer

	wmu      sync.Mutex    // guards w during transmission
	flushReq chan struct{} // a reply is waiting in w (capacity 1)
	active   atomic.Int32  // requests handed to workers and not yet answered
	noZeroes bool
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
		_ = nc.SetDeadline(time.Now().Add(timeout))
	}
	b, name, err := c.handshake()
	if err != nil || b == nil {
		return err
	}
	if isNet {
		_ = nc.SetDeadline(time.Time{})
	}
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
	for {
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
		switch opt {
		case optExportName:
			b, ok := c.s.Exports.Export(string(data))
			if !ok {
				return nil, "", violationf("NBD_OPT_EXPORT_NAME: no export %q", data)
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
	b, ok := c.s.Exports.Export(name)
	if !ok {
		return nil, name, fmt.Sprintf("no export named %q", name)
	}
	return b, name, ""
}

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
