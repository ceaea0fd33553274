package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Client is one NBD connection to an export. Its methods may be called from
// many goroutines; requests are pipelined and matched to replies by handle.
type Client struct {
	conn      net.Conn
	sizeBytes uint64
	flags     uint16

	wmu      sync.Mutex
	w        *bufio.Writer
	flushReq chan struct{} // a request is waiting in w (capacity 1)
	npending atomic.Int32  // requests sent or being sent, not yet answered

	r *bufio.Reader // read by the caller that is the reader (see wait)

	mu      sync.Mutex
	pending map[uint64]*call
	next    uint64
	reading bool  // some caller is the reader
	err     error // set once the connection failed
	done    chan struct{}
}

type call struct {
	buf     []byte // READ destination
	err     error
	done    chan struct{}
	promote chan struct{} // this caller is to become the reader (capacity 1)
	written bool          // the request is sent or buffered: the caller may read replies (c.mu)
}

// ParseURI splits nbd://HOST:PORT[/EXPORT] or nbd+unix:///EXPORT?socket=PATH
// into a network, an address and an export name.
func ParseURI(uri string) (network, addr, export string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", "", fmt.Errorf("nbd URI %q: %w", uri, err)
	}
	export = strings.TrimPrefix(u.Path, "/")
	switch u.Scheme {
	case "nbd":
		host := u.Host
		if host == "" {
			return "", "", "", fmt.Errorf("nbd URI %q: no host", uri)
		}
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "10809")
		}
		return "tcp", host, export, nil
	case "nbd+unix":
		sock := u.Query().Get("socket")
		if sock == "" {
			return "", "", "", fmt.Errorf("nbd URI %q: nbd+unix needs ?socket=PATH", uri)
		}
		return "unix", sock, export, nil
	}
	return "", "", "", fmt.Errorf("nbd URI %q: scheme must be nbd or nbd+unix", uri)
}

// Dial connects to an NBD server and opens export.
func Dial(ctx context.Context, network, addr, export string) (*Client, error) {
	return DialPoll(ctx, network, addr, export, 0)
}

// DialPoll is Dial with bounded busy polling of replies: after a request
// is sent with no other in flight, the caller waiting for its reply polls
// the socket for up to pollNs before parking (0: never). It trades CPU for latency (see
// Server.PollNs).
func DialPoll(ctx context.Context, network, addr, export string, pollNs int64) (*Client, error) {
	return dialOpts(ctx, network, addr, export, pollNs, nil)
}

// DialTLS is Dial through TLS: the client sends NBD_OPT_STARTTLS first and
// runs the TLS handshake with cfg (its certificate identifies the client
// to a server that asks for one) before opening export.
func DialTLS(ctx context.Context, network, addr, export string, cfg *tls.Config) (*Client, error) {
	return dialOpts(ctx, network, addr, export, 0, cfg)
}

func dialOpts(ctx context.Context, network, addr, export string, pollNs int64, tlsCfg *tls.Config) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	c, err := newClient(conn, export, pollNs, tlsCfg)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(timeZero)
	return c, nil
}

// NewClient runs the fixed newstyle handshake on conn (NBD_OPT_GO, falling
// back to NBD_OPT_EXPORT_NAME) and starts the reply reader.
func NewClient(conn net.Conn, export string) (*Client, error) {
	return newClient(conn, export, 0, nil)
}

func newClient(conn net.Conn, export string, pollNs int64, tlsCfg *tls.Config) (*Client, error) {
	conn = newPollConn(conn, pollNs)
	r := bufio.NewReaderSize(conn, 64<<10)
	w := bufio.NewWriterSize(conn, 64<<10)
	var h [18]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("nbd handshake: %w", err)
	}
	if binary.BigEndian.Uint64(h[0:]) != nbdMagic || binary.BigEndian.Uint64(h[8:]) != optMagic {
		return nil, errors.New("nbd handshake: not a newstyle NBD server")
	}
	sflags := binary.BigEndian.Uint16(h[16:])
	if sflags&flagFixedNewstyle == 0 {
		return nil, errors.New("nbd handshake: server does not offer fixed newstyle")
	}
	cflags := uint32(flagFixedNewstyle)
	if sflags&flagNoZeroes != 0 {
		cflags |= flagNoZeroes
	}
	var cf [4]byte
	binary.BigEndian.PutUint32(cf[:], cflags)
	w.Write(cf[:])
	if tlsCfg != nil {
		writeOpt(w, optStartTLS, nil)
		if err := w.Flush(); err != nil {
			return nil, fmt.Errorf("nbd handshake: %w", err)
		}
		typ, data, err := readOptReply(r)
		if err != nil {
			return nil, err
		}
		if typ != repAck {
			return nil, fmt.Errorf("nbd handshake: NBD_OPT_STARTTLS refused: server error %#x: %s", typ, data)
		}
		tc := tls.Client(conn, tlsCfg)
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("nbd handshake: TLS: %w", err)
		}
		conn = tc
		r = bufio.NewReaderSize(conn, 64<<10)
		w = bufio.NewWriterSize(conn, 64<<10)
	}
	// NBD_OPT_GO with no information requests.
	payload := make([]byte, 4+len(export)+2)
	binary.BigEndian.PutUint32(payload, uint32(len(export)))
	copy(payload[4:], export)
	writeOpt(w, optGo, payload)
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("nbd handshake: %w", err)
	}
	c := &Client{conn: conn, w: w, pending: map[uint64]*call{}, done: make(chan struct{}), flushReq: make(chan struct{}, 1)}
	gotInfo := false
	for {
		typ, data, err := readOptReply(r)
		if err != nil {
			return nil, err
		}
		n := len(data)
		switch {
		case typ == repInfo && n >= 12 && binary.BigEndian.Uint16(data) == infoExport:
			c.sizeBytes = binary.BigEndian.Uint64(data[2:])
			c.flags = binary.BigEndian.Uint16(data[10:])
			gotInfo = true
		case typ == repInfo:
		case typ == repAck:
			if !gotInfo {
				return nil, errors.New("nbd handshake: NBD_OPT_GO acknowledged without export info")
			}
			c.r = r
			go c.flusher()
			return c, nil
		case typ == repErrUnsup:
			// Old server: NBD_OPT_EXPORT_NAME.
			writeOpt(w, optExportName, []byte(export))
			if err := w.Flush(); err != nil {
				return nil, err
			}
			var rep [10]byte
			if _, err := io.ReadFull(r, rep[:]); err != nil {
				return nil, fmt.Errorf("nbd handshake: export %q: %w", export, err)
			}
			c.sizeBytes = binary.BigEndian.Uint64(rep[0:])
			c.flags = binary.BigEndian.Uint16(rep[8:])
			if cflags&flagNoZeroes == 0 {
				if _, err := io.CopyN(io.Discard, r, 124); err != nil {
					return nil, err
				}
			}
			c.r = r
			go c.flusher()
			return c, nil
		case typ&(1<<31) != 0:
			return nil, fmt.Errorf("nbd handshake: export %q: server error %#x: %s", export, typ, data)
		}
	}
}

var timeZero time.Time

// readOptReply reads one option reply: its type and data.
func readOptReply(r *bufio.Reader) (uint32, []byte, error) {
	var rh [20]byte
	if _, err := io.ReadFull(r, rh[:]); err != nil {
		return 0, nil, fmt.Errorf("nbd handshake: %w", err)
	}
	if binary.BigEndian.Uint64(rh[0:]) != optReplyMagic {
		return 0, nil, errors.New("nbd handshake: bad option reply magic")
	}
	typ := binary.BigEndian.Uint32(rh[12:])
	n := binary.BigEndian.Uint32(rh[16:])
	if n > maxOptionBytes {
		return 0, nil, errors.New("nbd handshake: option reply too large")
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return 0, nil, fmt.Errorf("nbd handshake: %w", err)
	}
	return typ, data, nil
}

func writeOpt(w *bufio.Writer, opt uint32, data []byte) {
	var h [16]byte
	binary.BigEndian.PutUint64(h[0:], optMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], uint32(len(data)))
	w.Write(h[:])
	w.Write(data)
}

// SizeBytes is the size of the export.
func (c *Client) SizeBytes() uint64 { return c.sizeBytes }

// Done is closed when the connection has failed or been closed. Replies are
// read only while requests are pending, so a connection the server closes
// while it is idle shows as failed at its next request.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is the reason the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Abort closes the connection at once, without NBD_CMD_DISC (which would
// wait behind a request stuck in writing): requests still pending fail with
// ErrClosed.
func (c *Client) Abort() { c.fail(ErrClosed) }

// Close ends the connection (politely, with NBD_CMD_DISC) and fails
// requests still pending.
func (c *Client) Close() error {
	var h [28]byte
	binary.BigEndian.PutUint32(h[0:], requestMagic)
	binary.BigEndian.PutUint16(h[6:], CmdDisc)
	c.wmu.Lock()
	c.w.Write(h[:])
	c.w.Flush()
	c.wmu.Unlock()
	c.fail(ErrClosed)
	return nil
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	p := c.pending
	c.pending = map[uint64]*call{}
	close(c.done)
	c.mu.Unlock()
	_ = c.conn.Close()
	for _, cl := range p {
		cl.err = err
		close(cl.done)
	}
}

// flusher sends buffered requests until the connection ends.
func (c *Client) flusher() {
	for {
		select {
		case <-c.done:
			return
		case <-c.flushReq:
			// As the server's flusher: requests issued together share
			// one write system call.
			runtime.Gosched()
			c.wmu.Lock()
			err := c.w.Flush()
			c.wmu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("nbd: sending request: %w", err))
				return
			}
		}
	}
}

// readOne reads one reply and completes its call.
func (c *Client) readOne() error {
	r := c.r
	var h [16]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return fmt.Errorf("nbd: reading reply: %w", err)
	}
	if binary.BigEndian.Uint32(h[0:]) != simpleMagic {
		return errors.New("nbd: bad reply magic (structured replies are not negotiated)")
	}
	errno := binary.BigEndian.Uint32(h[4:])
	handle := binary.BigEndian.Uint64(h[8:])
	c.mu.Lock()
	cl := c.pending[handle]
	delete(c.pending, handle)
	c.mu.Unlock()
	if cl == nil {
		return fmt.Errorf("nbd: reply for unknown handle %d", handle)
	}
	if errno != 0 {
		cl.err = &Error{Errno: errno}
	} else if cl.buf != nil {
		if _, err := io.ReadFull(r, cl.buf); err != nil {
			cl.err = err
			close(cl.done)
			return fmt.Errorf("nbd: reading data: %w", err)
		}
	}
	close(cl.done)
	return nil
}

// wait returns when cl is answered. There is no reply-reading goroutine:
// one of the waiting callers is the reader at a time (the first one, then
// whoever it promotes), so that at queue depth 1 the reply wakes the caller
// directly rather than a reader that then wakes the caller.
func (c *Client) wait(cl *call, reader bool) error {
	if !reader {
		select {
		case <-cl.done:
			return cl.err
		case <-cl.promote:
		}
	}
	for {
		select {
		case <-cl.done:
			c.passReader()
			return cl.err
		default:
		}
		if err := c.readOne(); err != nil {
			c.fail(err)
		}
	}
}

// passReader hands the reader role to a pending call whose request is
// written, if any (one still writing takes the role when it is done).
func (c *Client) passReader() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.pending {
		if p.written {
			p.promote <- struct{}{}
			return
		}
	}
	c.reading = false
}

// do sends one request and waits for its reply.
func (c *Client) do(typ, flags uint16, off uint64, length uint32, wdata, rbuf []byte) error {
	cl := &call{buf: rbuf, done: make(chan struct{}), promote: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.next++
	handle := c.next
	c.pending[handle] = cl
	c.mu.Unlock()
	c.npending.Add(1)
	defer c.npending.Add(-1)
	var h [28]byte
	binary.BigEndian.PutUint32(h[0:], requestMagic)
	binary.BigEndian.PutUint16(h[4:], flags)
	binary.BigEndian.PutUint16(h[6:], typ)
	binary.BigEndian.PutUint64(h[8:], handle)
	binary.BigEndian.PutUint64(h[16:], off)
	binary.BigEndian.PutUint32(h[24:], length)
	// Requests are written into the buffer and sent by the flusher, so
	// that requests issued together share a write system call.
	c.wmu.Lock()
	c.w.Write(h[:])
	_, err := c.w.Write(wdata)
	alone := c.npending.Load() <= 1
	if err == nil && alone {
		// Queue depth 1: send now rather than hand over to the flusher.
		err = c.w.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("nbd: sending request: %w", err))
	} else if alone {
		activity(c.conn)
	} else {
		select {
		case c.flushReq <- struct{}{}:
		default: // a flush is pending and will include this request
		}
	}
	// Only now may this caller read replies: a reader blocked in its own
	// write, behind a server that stopped reading requests until its
	// replies are read, would never read them (a deadlock with large
	// WRITEs against a server that bounds its memory, as ours does).
	c.mu.Lock()
	cl.written = true
	reader := !c.reading
	c.reading = true
	c.mu.Unlock()
	return c.wait(cl, reader)
}

// ReadAt reads len(p) bytes at off.
func (c *Client) ReadAt(p []byte, off uint64) error {
	return c.do(CmdRead, 0, off, uint32(len(p)), nil, p)
}

// WriteAt writes p at off; it returns once the server acknowledged it (with
// fua: once it is durable).
func (c *Client) WriteAt(p []byte, off uint64, fua bool) error {
	var f uint16
	if fua {
		f = CmdFlagFUA
	}
	return c.do(CmdWrite, f, off, uint32(len(p)), p, nil)
}

// Flush returns once every write acknowledged before it is durable.
func (c *Client) Flush() error { return c.do(CmdFlush, 0, 0, 0, nil, nil) }

// Trim discards length bytes at off.
func (c *Client) Trim(off, lengthBytes uint64) error {
	return c.do(CmdTrim, 0, off, uint32(lengthBytes), nil, nil)
}
