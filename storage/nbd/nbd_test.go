package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// memBackend is an in-memory export for tests.
type memBackend struct {
	mu      sync.Mutex
	data    []byte
	flushes int
}

func (m *memBackend) SizeBytes() uint64 { return uint64(len(m.data)) }
func (m *memBackend) ReadAt(p []byte, off uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(p, m.data[off:])
	return nil
}
func (m *memBackend) WriteAt(p []byte, off uint64, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.data[off:], p)
	return nil
}
func (m *memBackend) Flush() error { m.mu.Lock(); m.flushes++; m.mu.Unlock(); return nil }
func (m *memBackend) Trim(off, n uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+n])
	return nil
}

func startServer(t *testing.T, ex Exports) (*Server, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Exports: ex, HandshakeTimeout: 2 * time.Second}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return s, l.Addr().String()
}

func dial(t *testing.T, addr, export string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, "tcp", addr, export)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRoundTripConcurrent(t *testing.T) {
	mem := &memBackend{data: make([]byte, 1<<20)}
	_, addr := startServer(t, MapExports{"vm1/disk0": mem})
	c := dial(t, addr, "vm1/disk0")
	if c.SizeBytes() != 1<<20 {
		t.Fatalf("size %d, want %d", c.SizeBytes(), 1<<20)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := bytes.Repeat([]byte{byte(i + 1)}, 4096)
			if err := c.WriteAt(p, uint64(i)*4096, i%2 == 0); err != nil {
				errs <- err
				return
			}
			q := make([]byte, 4096)
			if err := c.ReadAt(q, uint64(i)*4096); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(p, q) {
				errs <- io.ErrUnexpectedEOF
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Trim(0, 4096); err != nil {
		t.Fatal(err)
	}
	q := make([]byte, 4096)
	if err := c.ReadAt(q, 0); err != nil || !bytes.Equal(q, make([]byte, 4096)) {
		t.Fatalf("after trim: err=%v, data not zero", err)
	}
	// Out of range: EINVAL for read, ENOSPC for write; the connection stays up.
	if err := c.ReadAt(q, 1<<20); err == nil || err.(*Error).Errno != EINVAL {
		t.Fatalf("read past end: %v, want EINVAL", err)
	}
	if err := c.WriteAt(q, 1<<20-100, false); err == nil || err.(*Error).Errno != ENOSPC {
		t.Fatalf("write past end: %v, want ENOSPC", err)
	}
	if err := c.ReadAt(q, 0); err != nil {
		t.Fatalf("connection unusable after errors: %v", err)
	}
}

func TestUnknownExport(t *testing.T) {
	_, addr := startServer(t, MapExports{"a/b": &memBackend{data: make([]byte, 4096)}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, "tcp", addr, "nope")
	if err == nil {
		t.Fatal("dial of unknown export succeeded")
	}
	if want := `no export named "nope"`; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

// A client that breaks the protocol loses its own connection only.
func TestBadClientDoesNotAffectOthers(t *testing.T) {
	mem := &memBackend{data: make([]byte, 1<<16)}
	_, addr := startServer(t, MapExports{"d": mem})
	good := dial(t, addr, "d")
	bad := dial(t, addr, "d")
	// Raw garbage on the bad connection after the handshake.
	bad.wmu.Lock()
	bad.w.Write(bytes.Repeat([]byte{0xff}, 64))
	bad.w.Flush()
	bad.wmu.Unlock()
	// The server drops the connection: the bad client's next request
	// fails (replies are read only while requests are pending).
	res := make(chan error, 1)
	go func() { res <- bad.ReadAt(make([]byte, 512), 0) }()
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("server kept a connection that sent a bad request magic")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server kept a connection that sent a bad request magic")
	}
	select {
	case <-bad.Done():
	default:
		t.Fatal("failed connection not reported by Done")
	}
	p := []byte("still fine")
	if err := good.WriteAt(p, 0, false); err != nil {
		t.Fatal(err)
	}
	q := make([]byte, len(p))
	if err := good.ReadAt(q, 0); err != nil || !bytes.Equal(p, q) {
		t.Fatalf("good client: %v %q", err, q)
	}
}

// Old-style NBD_OPT_EXPORT_NAME and NBD_OPT_LIST work.
func TestExportNameAndList(t *testing.T) {
	_, addr := startServer(t, MapExports{"x/y": &memBackend{data: make([]byte, 8192)}})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 18)
	io.ReadFull(conn, hdr)
	binary.Write(conn, binary.BigEndian, uint32(flagFixedNewstyle|flagNoZeroes))
	sendOpt := func(opt uint32, data []byte) {
		binary.Write(conn, binary.BigEndian, uint64(optMagic))
		binary.Write(conn, binary.BigEndian, opt)
		binary.Write(conn, binary.BigEndian, uint32(len(data)))
		conn.Write(data)
	}
	sendOpt(optList, nil)
	var names []string
	for {
		var rh [20]byte
		if _, err := io.ReadFull(conn, rh[:]); err != nil {
			t.Fatal(err)
		}
		typ := binary.BigEndian.Uint32(rh[12:])
		data := make([]byte, binary.BigEndian.Uint32(rh[16:]))
		io.ReadFull(conn, data)
		if typ == repAck {
			break
		}
		names = append(names, string(data[4:]))
	}
	if len(names) != 1 || names[0] != "x/y" {
		t.Fatalf("list: %q", names)
	}
	sendOpt(optExportName, []byte("x/y"))
	var rep [10]byte
	if _, err := io.ReadFull(conn, rep[:]); err != nil {
		t.Fatal(err)
	}
	if sz := binary.BigEndian.Uint64(rep[:]); sz != 8192 {
		t.Fatalf("size %d", sz)
	}
}

// gatedBackend holds every READ and WRITE until the test lets it go, and
// records how many payload bytes it holds at once.
type gatedBackend struct {
	memBackend
	entered chan struct{}
	gate    chan struct{}
	mu      sync.Mutex
	held    int
	maxHeld int
}

func (g *gatedBackend) hold(n int) {
	g.mu.Lock()
	g.held += n
	g.maxHeld = max(g.maxHeld, g.held)
	g.mu.Unlock()
	g.entered <- struct{}{}
	<-g.gate
	g.mu.Lock()
	g.held -= n
	g.mu.Unlock()
}

func (g *gatedBackend) ReadAt(p []byte, off uint64) error {
	g.hold(len(p))
	return g.memBackend.ReadAt(p, off)
}

func (g *gatedBackend) WriteAt(p []byte, off uint64, fua bool) error {
	g.hold(len(p))
	return g.memBackend.WriteAt(p, off, fua)
}

// A client that sends more large requests than the server will buffer is
// held back (its requests wait in the socket), not served into memory: the
// server holds at most MaxInFlightBytes of one connection's payloads.
func TestInFlightBytesBounded(t *testing.T) {
	const size, n = 2 << 20, 40 // 80 MiB asked for at once
	limit := MaxPayloadBytes / size
	g := &gatedBackend{memBackend: memBackend{data: make([]byte, size)}, entered: make(chan struct{}, n), gate: make(chan struct{})}
	waiting := make(chan struct{}, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Exports: MapExports{"d": g}, MaxInFlightBytes: MaxPayloadBytes, testBudgetWait: func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	c := dial(t, l.Addr().String(), "d")
	var open sync.Once
	release := func() { open.Do(func() { close(g.gate) }) }
	t.Cleanup(release) // before the server's Close, which waits for the requests
	errs := make(chan error, n)
	for i := range n {
		go func() {
			buf := make([]byte, size)
			if i%2 == 0 {
				errs <- c.WriteAt(buf, 0, false)
			} else {
				errs <- c.ReadAt(buf, 0)
			}
		}()
	}
	for range limit {
		<-g.entered
	}
	select {
	case <-waiting: // the reader waits for memory: nothing more can enter
	case <-time.After(10 * time.Second):
		t.Fatal("the server never stopped reading requests for lack of memory")
	}
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held != MaxPayloadBytes || len(g.entered) != 0 {
		t.Fatalf("server holds %d payload bytes of one connection (%d more requests entered), bound %d", held, len(g.entered), MaxPayloadBytes)
	}
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.maxHeld > MaxPayloadBytes {
		t.Fatalf("server held %d payload bytes of one connection at once, bound %d", g.maxHeld, MaxPayloadBytes)
	}
}
