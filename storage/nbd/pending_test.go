package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// dialFrom opens a connection to addr from local address src and reads the
// greeting.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 18)); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	return c
}

// closedByServer reports whether the server closed c (a read ends with
// end of file or a reset rather than data or the test's deadline).
func closedByServer(c net.Conn) bool {
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF || isReset(err)
}

// On a TLS listener with MaxUnauthenticated 3, 2 per source and an
// AuthTimeout of 400 ms: a third unauthenticated connection from one
// address closes that address's oldest, a fourth in all the oldest of
// all; an authenticated connection is never displaced; an idle one is cut
// after AuthTimeout, well before HandshakeTimeout.
func TestUnauthenticatedBounds(t *testing.T) {
	_, srvTLS, clients := tlsSetup(t, "a")
	s := &Server{Exports: threeExports(), HandshakeTimeout: 5 * time.Second}
	addr := serveAccess(t, s, Access{Allow: ownDisks, TLS: srvTLS, MaxUnauthenticated: 3, MaxUnauthenticatedPerSource: 2, AuthTimeout: 400 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	authed, err := DialTLS(ctx, "tcp", addr, "a/d0", clients["a"])
	if err != nil {
		t.Fatal(err)
	}
	defer authed.Close()

	p1 := dialFrom(t, "127.0.0.1", addr)
	p2 := dialFrom(t, "127.0.0.1", addr)
	dialFrom(t, "127.0.0.1", addr) // p3
	if !closedByServer(p1) {
		t.Fatal("third unauthenticated connection from 127.0.0.1 (2 per source): the oldest was not closed")
	}
	p4 := dialFrom(t, "127.0.0.1", addr)
	if !closedByServer(p2) {
		t.Fatal("fourth from 127.0.0.1: the second was not closed (oldest first)")
	}
	_ = p4
	q1start := time.Now()
	q1 := dialFrom(t, "127.0.0.2", addr) // p3, p4, q1: 3 unauthenticated
	dialFrom(t, "127.0.0.3", addr)       // a fourth in all: p3, the oldest, goes
	if s.Displaced() != 3 {
		t.Fatalf("Displaced() = %d, want 3", s.Displaced())
	}
	buf := make([]byte, 4096)
	if err := authed.ReadAt(buf, 0); err != nil {
		t.Fatalf("authenticated connection after the displacements: %v", err)
	}
	if !closedByServer(q1) {
		t.Fatal("an idle unauthenticated connection was not cut")
	}
	if d := time.Since(q1start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Fatalf("idle unauthenticated connection cut after %v, want about the 400 ms AuthTimeout", d)
	}
}

// With MaxConnsPerIdentity 2, a third connection with a's certificate is
// closed after its TLS handshake; b's certificate still opens b's disk;
// when one of a's closes, a opens again.
func TestConnsPerIdentity(t *testing.T) {
	_, srvTLS, clients := tlsSetup(t, "a", "b")
	s := &Server{Exports: threeExports(), HandshakeTimeout: 5 * time.Second}
	addr := serveAccess(t, s, Access{Allow: ownDisks, TLS: srvTLS, MaxConnsPerIdentity: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var open []*Client
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := DialTLS(ctx, "tcp", addr, "a/d0", clients["a"])
		if err != nil {
			t.Fatalf("a's connection %d: %v", i, err)
		}
		open = append(open, c)
	}
	if c, err := DialTLS(ctx, "tcp", addr, "a/d0", clients["a"]); err == nil {
		c.Close()
		t.Fatal("a's third connection was served with MaxConnsPerIdentity 2")
	}
	b, err := DialTLS(ctx, "tcp", addr, "b/d0", clients["b"])
	if err != nil {
		t.Fatalf("b beside a's two connections: %v", err)
	}
	open = append(open, b)
	open[0].Close()
	<-open[0].Done()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := DialTLS(ctx, "tcp", addr, "a/d0", clients["a"])
		if err == nil {
			open = append(open, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a could not open again after closing one of its two: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the server sees the close asynchronously
	}
}

// Idle connections are displaced before one that asked for TLS: c1 sends
// NBD_OPT_STARTTLS and then stalls (as a slow TLS handshake would); with
// 2 unauthenticated connections per source, each newer connection
// displaces the idle one before it, never c1, whose TLS handshake then
// succeeds.
func TestIdleDisplacedFirst(t *testing.T) {
	_, srvTLS, clients := tlsSetup(t, "a")
	s := &Server{Exports: threeExports(), HandshakeTimeout: 5 * time.Second}
	addr := serveAccess(t, s, Access{Allow: ownDisks, TLS: srvTLS, MaxUnauthenticatedPerSource: 2})
	c1 := rawDial(t, "tcp", addr)
	c1.opt(optStartTLS, nil)
	if typ, _ := c1.mustReply(optStartTLS); typ != repAck {
		t.Fatalf("NBD_OPT_STARTTLS: reply %#x", typ)
	}
	idle := dialFrom(t, "127.0.0.1", addr)
	for i := 0; i < 3; i++ {
		next := dialFrom(t, "127.0.0.1", addr)
		if !closedByServer(idle) {
			t.Fatalf("newer connection %d: the idle one before it was not displaced", i)
		}
		idle = next
	}
	tc := tls.Client(c1.conn, clients["a"])
	if err := tc.Handshake(); err != nil {
		t.Fatalf("the connection in its TLS handshake was displaced: %v", err)
	}
	c1.conn, c1.r = tc, bufio.NewReader(tc)
	if typ := c1.goOpt(optGo, "a/d0"); typ != repAck {
		t.Fatalf("NBD_OPT_GO after TLS: reply %#x", typ)
	}
}
