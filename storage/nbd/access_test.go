package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/internal/testcert"
)

// ownDisks allows a VM the exports named "VM/...".
func ownDisks(id, export string) bool { return id != "" && strings.HasPrefix(export, id+"/") }

// rawClient speaks the handshake by hand, for what Client does not do.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func rawDial(t *testing.T, network, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
	var h [18]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	var cf [4]byte
	binary.BigEndian.PutUint32(cf[:], flagFixedNewstyle|flagNoZeroes)
	c.write(cf[:])
	return c
}

func (c *rawClient) write(b []byte) {
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rawClient) opt(opt uint32, data []byte) {
	var h [16]byte
	binary.BigEndian.PutUint64(h[0:], optMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], uint32(len(data)))
	c.write(append(h[:], data...))
}

// reply reads one option reply; err is io.EOF and the like if the server
// closed the connection.
func (c *rawClient) reply() (typ uint32, data []byte, err error) {
	t, d, err := readOptReply(c.r)
	return t, d, err
}

func (c *rawClient) mustReply(wantOpt uint32) (uint32, []byte) {
	c.t.Helper()
	typ, data, err := c.reply()
	if err != nil {
		c.t.Fatalf("option %d: %v", wantOpt, err)
	}
	return typ, data
}

// list sends NBD_OPT_LIST and returns the names, or the error reply type.
func (c *rawClient) list() ([]string, uint32) {
	c.t.Helper()
	c.opt(optList, nil)
	var names []string
	for {
		typ, data := c.mustReply(optList)
		switch typ {
		case repServer:
			n := binary.BigEndian.Uint32(data)
			names = append(names, string(data[4:4+n]))
		case repAck:
			return names, 0
		default:
			return nil, typ
		}
	}
}

// goOpt sends NBD_OPT_GO (or INFO) for name and returns the final reply type.
func (c *rawClient) goOpt(opt uint32, name string) uint32 {
	c.t.Helper()
	p := make([]byte, 4+len(name)+2)
	binary.BigEndian.PutUint32(p, uint32(len(name)))
	copy(p[4:], name)
	c.opt(opt, p)
	for {
		typ, _ := c.mustReply(opt)
		if typ != repInfo {
			return typ
		}
	}
}

// startTLS sends NBD_OPT_STARTTLS and, when acknowledged, runs the TLS
// handshake with cfg; it returns the reply type.
func (c *rawClient) startTLS(cfg *tls.Config) (uint32, error) {
	c.t.Helper()
	c.opt(optStartTLS, nil)
	typ, _ := c.mustReply(optStartTLS)
	if typ != repAck {
		return typ, nil
	}
	tc := tls.Client(c.conn, cfg)
	if err := tc.Handshake(); err != nil {
		return typ, err
	}
	c.conn, c.r = tc, bufio.NewReader(tc)
	return typ, nil
}

func threeExports() MapExports {
	return MapExports{"a/d0": &memBackend{data: make([]byte, 1<<20)}, "a/d1": &memBackend{data: make([]byte, 1<<20)},
		"b/d0": &memBackend{data: make([]byte, 1<<20)}}
}

func serveAccess(t *testing.T, s *Server, a Access) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeAccess(l, a)
	t.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// A connection with identity "a" lists and opens only a's exports; b's
// are answered like exports that do not exist.
func TestAccessOwnExportsOnly(t *testing.T) {
	s := &Server{Exports: threeExports(), HandshakeTimeout: 5 * time.Second}
	addr := serveAccess(t, s, Access{Identity: "a", Allow: ownDisks})
	c := rawDial(t, "tcp", addr)
	if names, e := c.list(); e != 0 || !reflect.DeepEqual(names, []string{"a/d0", "a/d1"}) {
		t.Fatalf("NBD_OPT_LIST = %q (error %#x), want [a/d0 a/d1]", names, e)
	}
	for _, opt := range []uint32{optInfo, optGo} {
		for _, name := range []string{"b/d0", "nope"} {
			if typ := c.goOpt(opt, name); typ != repErrUnknown {
				t.Errorf("option %d for %q: reply %#x, want NBD_REP_ERR_UNKNOWN", opt, name, typ)
			}
		}
	}
	if typ := c.goOpt(optGo, "a/d1"); typ != repAck {
		t.Fatalf("NBD_OPT_GO a/d1: reply %#x, want ACK", typ)
	}
	// NBD_OPT_EXPORT_NAME of another's export: the connection is closed.
	c2 := rawDial(t, "tcp", addr)
	c2.opt(optExportName, []byte("b/d0"))
	if _, err := io.ReadFull(c2.r, make([]byte, 10)); err == nil {
		t.Fatal("NBD_OPT_EXPORT_NAME b/d0 answered for identity a")
	}
	// And the Client: a opens its own, not b's.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cl, err := Dial(ctx, "tcp", addr, "b/d0"); err == nil {
		cl.Close()
		t.Fatal("Dial b/d0 succeeded for identity a")
	}
	cl := dial(t, addr, "a/d0")
	if err := cl.WriteAt([]byte("mine"), 0, false); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	// A listener without Allow serves everything (the administrator's socket).
	s2 := &Server{Exports: threeExports()}
	all := rawDial(t, "tcp", serveAccess(t, s2, Access{}))
	if names, _ := all.list(); len(names) != 3 {
		t.Fatalf("listener without Allow lists %q, want all 3", names)
	}
}

// tlsSetup makes a CA, the server's TLS configuration (client certificates
// required) and client configurations for identities.
func tlsSetup(t *testing.T, ids ...string) (*testcert.CA, *tls.Config, map[string]*tls.Config) {
	t.Helper()
	ca, err := testcert.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	srv := &tls.Config{Certificates: []tls.Certificate{sp.TLS()}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	clients := map[string]*tls.Config{}
	for _, id := range ids {
		cp, err := ca.Client(id)
		if err != nil {
			t.Fatal(err)
		}
		clients[id] = &tls.Config{Certificates: []tls.Certificate{cp.TLS()}, RootCAs: ca.Pool(), ServerName: "localhost"}
	}
	return ca, srv, clients
}

// With TLS required: options before STARTTLS get NBD_REP_ERR_TLS_REQD; the
// client certificate's CN is the identity; a certificate of another CA or
// none fails the TLS handshake.
func TestTLSRequired(t *testing.T) {
	_, srvTLS, clients := tlsSetup(t, "a", "b")
	s := &Server{Exports: threeExports(), HandshakeTimeout: 5 * time.Second}
	addr := serveAccess(t, s, Access{Allow: ownDisks, TLS: srvTLS})

	plain := rawDial(t, "tcp", addr)
	if typ := plain.goOpt(optGo, "a/d0"); typ != repErrTLSReqd {
		t.Fatalf("plain NBD_OPT_GO: reply %#x, want NBD_REP_ERR_TLS_REQD", typ)
	}
	if _, e := plain.list(); e != repErrTLSReqd {
		t.Fatalf("plain NBD_OPT_LIST: reply %#x, want NBD_REP_ERR_TLS_REQD", e)
	}
	plain.opt(optExportName, []byte("a/d0"))
	if _, err := io.ReadFull(plain.r, make([]byte, 10)); err == nil {
		t.Fatal("plain NBD_OPT_EXPORT_NAME was answered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cl, err := Dial(ctx, "tcp", addr, "a/d0"); err == nil {
		cl.Close()
		t.Fatal("plain Dial succeeded on a TLS-only listener")
	} else if !strings.Contains(err.Error(), "0x80000005") {
		t.Fatalf("plain Dial: %v, want NBD_REP_ERR_TLS_REQD (0x80000005)", err)
	}

	c := rawDial(t, "tcp", addr)
	if typ, err := c.startTLS(clients["b"]); typ != repAck || err != nil {
		t.Fatalf("STARTTLS: reply %#x, %v", typ, err)
	}
	if names, e := c.list(); e != 0 || !reflect.DeepEqual(names, []string{"b/d0"}) {
		t.Fatalf("NBD_OPT_LIST over TLS as b = %q (error %#x), want [b/d0]", names, e)
	}
	if typ, _ := c.startTLS(clients["b"]); typ != repErrInvalid {
		t.Fatalf("second STARTTLS: reply %#x, want NBD_REP_ERR_INVALID", typ)
	}
	if typ := c.goOpt(optGo, "a/d0"); typ != repErrUnknown {
		t.Fatalf("b's NBD_OPT_GO a/d0: reply %#x, want NBD_REP_ERR_UNKNOWN", typ)
	}

	// Data through TLS, as a.
	cl, err := DialTLS(ctx, "tcp", addr, "a/d0", clients["a"])
	if err != nil {
		t.Fatal(err)
	}
	w := []byte("through TLS")
	if err := cl.WriteAt(w, 4096, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(w))
	if err := cl.ReadAt(got, 4096); err != nil || string(got) != string(w) {
		t.Fatalf("read back %q, %v", got, err)
	}
	cl.Close()
	if _, err := DialTLS(ctx, "tcp", addr, "b/d0", clients["a"]); err == nil {
		t.Fatal("a opened b/d0 over TLS")
	}

	// A client certificate from another CA, or none: no TLS session.
	_, _, strangers := tlsSetup(t, "a")
	stranger := strangers["a"].Clone()
	stranger.RootCAs = clients["a"].RootCAs // it trusts the server
	if _, err := DialTLS(ctx, "tcp", addr, "a/d0", stranger); err == nil {
		t.Fatal("a certificate of another CA was accepted")
	}
	// The server's own certificate (same CA, server use only) as a client's.
	if _, err := DialTLS(ctx, "tcp", addr, "a/d0", &tls.Config{Certificates: srvTLS.Certificates, RootCAs: clients["a"].RootCAs, ServerName: "localhost"}); err == nil {
		t.Fatal("a server-only certificate was accepted as a client's")
	}
	anon := &tls.Config{RootCAs: clients["a"].RootCAs, ServerName: "localhost"}
	if _, err := DialTLS(ctx, "tcp", addr, "a/d0", anon); err == nil {
		t.Fatal("a client without certificate was accepted")
	}

	// STARTTLS where TLS is not offered: NBD_REP_ERR_UNSUP.
	s2 := &Server{Exports: threeExports()}
	c2 := rawDial(t, "tcp", serveAccess(t, s2, Access{}))
	if typ, _ := c2.startTLS(clients["a"]); typ != repErrUnsup {
		t.Fatalf("STARTTLS without TLS: reply %#x, want NBD_REP_ERR_UNSUP", typ)
	}
}

// waitGreeting reports whether a new connection to addr gets the NBD
// greeting (false: closed at once).
func gotGreeting(t *testing.T, addr string) (net.Conn, bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var h [18]byte
	_, err = io.ReadFull(conn, h[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
		t.Fatalf("greeting: %v", err)
	}
	return conn, err == nil
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

// Connections beyond the server's or the listener's cap are closed at once;
// a place freed is taken again.
func TestConnectionCaps(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	s := &Server{Exports: threeExports(), MaxConns: 4, Logf: func(f string, a ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(f, a...))
		mu.Unlock()
	}}
	addrA := serveAccess(t, s, Access{MaxConns: 2})
	addrB := serveAccess(t, s, Access{})
	var open []net.Conn
	for i, addr := range []string{addrA, addrA} {
		c, ok := gotGreeting(t, addr)
		if !ok {
			t.Fatalf("connection %d refused under the caps", i)
		}
		open = append(open, c)
	}
	if _, ok := gotGreeting(t, addrA); ok {
		t.Fatal("third connection on a listener capped at 2 was served")
	}
	for i := 0; i < 2; i++ {
		c, ok := gotGreeting(t, addrB)
		if !ok {
			t.Fatalf("connection %d on the other listener refused", i)
		}
		open = append(open, c)
	}
	if _, ok := gotGreeting(t, addrB); ok {
		t.Fatal("fifth connection served with MaxConns 4")
	}
	if s.Refused() != 2 {
		t.Fatalf("Refused() = %d, want 2", s.Refused())
	}
	mu.Lock()
	if len(logged) == 0 || logged[0] != "nbd: connection refused: 2 connections open on this listener (limit 2)" {
		t.Errorf("logged %q; want the first refusal", logged)
	}
	mu.Unlock()
	open[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, ok := gotGreeting(t, addrA)
		if ok {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a freed place was not taken again within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range open[1:] {
		c.Close()
	}
}

// A client that sends its handshake slowly, or stops in the middle of it,
// is cut off after HandshakeTimeout; an oversized option at once.
func TestHandshakeBounded(t *testing.T) {
	s := &Server{Exports: threeExports(), HandshakeTimeout: 500 * time.Millisecond}
	addr := serveAccess(t, s, Access{})
	// Slow: one byte of an option every 100 ms.
	c := rawDial(t, "tcp", addr)
	start := time.Now()
	var opt [16]byte
	binary.BigEndian.PutUint64(opt[0:], optMagic)
	binary.BigEndian.PutUint32(opt[8:], optList)
	closed := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, c.r)
		closed <- time.Since(start)
	}()
	for i := 0; ; i++ {
		if _, err := c.conn.Write(opt[i%16 : i%16+1]); err != nil {
			break
		}
		select {
		case d := <-closed:
			if d < 400*time.Millisecond || d > 3*time.Second {
				t.Fatalf("slow handshake cut after %v, want about the 500 ms HandshakeTimeout", d)
			}
			goto huge
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("slow handshake still open after 5 s")
		}
	}
huge:
	c2 := rawDial(t, "tcp", addr)
	var h [16]byte
	binary.BigEndian.PutUint64(h[0:], optMagic)
	binary.BigEndian.PutUint32(h[8:], optList)
	binary.BigEndian.PutUint32(h[12:], 1<<30)
	c2.write(h[:])
	if _, _, err := c2.reply(); err == nil {
		t.Fatal("a 1 GiB option was answered")
	}
	// Endless options: cut after maxOptions.
	c3 := rawDial(t, "tcp", addr)
	n := 0
	for ; n <= maxOptions+1; n++ {
		c3.opt(99, nil)
		if _, _, err := c3.reply(); err != nil {
			break
		}
	}
	if n != maxOptions {
		t.Fatalf("connection ended after %d options, want %d", n, maxOptions)
	}
}

// The connections of one identity (a VM) share one MaxInFlightBytes: two
// connections sending 80 MiB of large requests at once get 32 MiB in
// flight together, not 32 MiB each.
func TestInFlightBytesPerIdentity(t *testing.T) {
	const size, n = 2 << 20, 40
	limit := MaxPayloadBytes / size
	g := &gatedBackend{memBackend: memBackend{data: make([]byte, size)}, entered: make(chan struct{}, n), gate: make(chan struct{})}
	var mu sync.Mutex
	waits := 0
	twoWaiting := make(chan struct{})
	s := &Server{Exports: MapExports{"a/d": g}, MaxInFlightBytes: MaxPayloadBytes, testBudgetWait: func() {
		mu.Lock()
		defer mu.Unlock()
		// No request finishes while the gate is shut: each reader waits
		// once, so two calls are two readers waiting.
		if waits++; waits == 2 {
			close(twoWaiting)
		}
	}}
	addr := serveAccess(t, s, Access{Identity: "a", Allow: ownDisks})
	c1, c2 := dial(t, addr, "a/d"), dial(t, addr, "a/d")
	var open sync.Once
	release := func() { open.Do(func() { close(g.gate) }) }
	t.Cleanup(release)
	errs := make(chan error, n)
	for i := range n {
		c := c1
		if i%2 == 1 {
			c = c2
		}
		go func() { errs <- c.WriteAt(make([]byte, size), 0, false) }()
	}
	select {
	case <-twoWaiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the two connections' readers never both waited for memory")
	}
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held != MaxPayloadBytes || len(g.entered) != limit {
		t.Fatalf("server holds %d payload bytes for identity a over 2 connections (%d requests entered), bound %d", held, len(g.entered), MaxPayloadBytes)
	}
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// Failed handshakes, which anybody who reaches a listener can cause, are
// logged at most once a second.
func TestHandshakeFailuresLogLimited(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	s := &Server{Exports: threeExports(), Logf: func(f string, a ...any) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf(f, a...))
		mu.Unlock()
	}}
	addr := serveAccess(t, s, Access{})
	start := time.Now()
	const n = 20
	for i := 0; i < n; i++ {
		c := rawDial(t, "tcp", addr)
		c.write(make([]byte, 16)) // bad option magic
		if _, err := io.Copy(io.Discard, c.r); err != nil && !isReset(err) {
			t.Fatal(err)
		}
		c.conn.Close()
	}
	elapsed := time.Since(start)
	s.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(lines) == 0 || len(lines) > 1+int(elapsed/time.Second) || !strings.Contains(lines[0], "connection closed in the handshake (a client without identity): protocol violation: bad option magic") {
		t.Fatalf("%d bad handshakes in %v logged %d lines: %q", n, elapsed, len(lines), lines)
	}
}

// A certificate whose subject has several common names is ambiguous: no
// identity, no export (Go's Subject.CommonName keeps the last one).
func TestCertIdentityAmbiguous(t *testing.T) {
	cn := func(v string) pkix.AttributeTypeAndValue {
		return pkix.AttributeTypeAndValue{Type: oidCommonName, Value: v}
	}
	one := pkix.Name{CommonName: "vm1", Names: []pkix.AttributeTypeAndValue{cn("vm1")}}
	two := pkix.Name{CommonName: "vm2", Names: []pkix.AttributeTypeAndValue{cn("vm1"), cn("vm2")}}
	none := pkix.Name{}
	if got := certIdentity(one); got != "vm1" {
		t.Errorf("CN=vm1: identity %q", got)
	}
	if got := certIdentity(two); got != "" {
		t.Errorf("CN=vm1,CN=vm2: identity %q, want none", got)
	}
	if got := certIdentity(none); got != "" {
		t.Errorf("no CN: identity %q, want none", got)
	}
}
