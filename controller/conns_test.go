package controller

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serveTLS serves srv with the generated certificate on 127.0.0.1 and
// returns its address.
func serveTLS(t *testing.T, srv *http.Server) string {
	t.Helper()
	cert, key, err := EnsureCert("", "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(l, cert, key)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// dialTLS opens a TLS connection to addr from the address from (h2 or
// http/1.1 by ALPN) and reports whether the handshake succeeded.
func dialTLS(t *testing.T, from, addr, proto string) (*tls.Conn, error) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{proto}})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestConnLimits: connections beyond the limit per address, or in all,
// are closed before their handshake; a closed connection gives its place
// back.
func TestConnLimits(t *testing.T) {
	srv := NewHTTPServerLimits("", http.NotFoundHandler(), 3, 2)
	closed := make(chan struct{}, 16)
	track := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		track(c, st)
		if st == http.StateClosed {
			closed <- struct{}{}
		}
	}
	addr := serveTLS(t, srv)
	a1, err := dialTLS(t, "127.0.0.1", addr, "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialTLS(t, "127.0.0.1", addr, "h2"); err != nil {
		t.Fatal(err)
	}
	if _, err := dialTLS(t, "127.0.0.1", addr, "h2"); err == nil {
		t.Error("a third connection from 127.0.0.1 (2 per address): served, want closed")
	}
	<-closed
	if _, err := dialTLS(t, "127.0.0.2", addr, "h2"); err != nil {
		t.Fatalf("from 127.0.0.2: %v", err)
	}
	if _, err := dialTLS(t, "127.0.0.3", addr, "h2"); err == nil {
		t.Error("a fourth connection (3 in all): served, want closed")
	}
	<-closed
	a1.Close()
	<-closed
	if _, err := dialTLS(t, "127.0.0.1", addr, "h2"); err != nil {
		t.Errorf("after one of 127.0.0.1's connections closed: %v, want served", err)
	}
}

// TestHTTP2Limits: the server announces MaxStreams concurrent streams per
// HTTP/2 connection and closes an idle connection after its idle
// timeout.
func TestHTTP2Limits(t *testing.T) {
	srv := NewHTTPServer("", http.NotFoundHandler())
	if srv.IdleTimeout != IdleTimeout || IdleTimeout > time.Minute {
		t.Errorf("idle timeout %v", srv.IdleTimeout)
	}
	srv.IdleTimeout = 300 * time.Millisecond // to see it close within the test
	addr := serveTLS(t, srv)
	c, err := dialTLS(t, "127.0.0.1", addr, "h2")
	if err != nil || c.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("h2: %v %q", err, c.ConnectionState().NegotiatedProtocol)
	}
	// The client preface and an empty SETTINGS frame.
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	streams, goaway := -1, false
	for {
		var h [9]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			break // closed by the server
		}
		n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			break
		}
		switch h[3] {
		case 0x4: // SETTINGS
			for i := 0; i+6 <= n && h[4]&1 == 0; i += 6 {
				if binary.BigEndian.Uint16(payload[i:]) == 0x3 { // MAX_CONCURRENT_STREAMS
					streams = int(binary.BigEndian.Uint32(payload[i+2:]))
				}
			}
		case 0x7: // GOAWAY
			goaway = true
		}
	}
	if streams != MaxStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", streams, MaxStreams)
	}
	if !goaway {
		t.Error("the idle connection was not closed with GOAWAY")
	}
}
