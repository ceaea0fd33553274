package controller

import (
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits on the API's connections (docs/controller.md, Security).
const (
	// MaxConns is how many connections the API holds at once, and
	// MaxConnsPerIP how many from one address; a connection beyond
	// either is closed at once, before its TLS handshake.
	MaxConns      = 8192
	MaxConnsPerIP = 256
	// MaxStreams is how many requests one HTTP/2 connection may have
	// under way at once.
	MaxStreams = 100
	// IdleTimeout closes a connection (HTTP/1.1 or HTTP/2) that has had
	// no request for this long.
	IdleTimeout = 30 * time.Second
)

// NewHTTPServer returns the HTTPS server of h on addr, with timeouts that
// let a watch of MaxWatch finish and the connection limits above.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return newHTTPServer(addr, h, MaxConns, MaxConnsPerIP)
}

// NewHTTPServerLimits is NewHTTPServer with other connection limits: at
// most maxConns in all and maxPerIP from one address (hosts behind one
// NAT address share its places; sluice controller --max-conns,
// --max-conns-per-addr). Limits below 1 are 1.
func NewHTTPServerLimits(addr string, h http.Handler, maxConns, maxPerIP int) *http.Server {
	return newHTTPServer(addr, h, max(maxConns, 1), max(maxPerIP, 1))
}

func newHTTPServer(addr string, h http.Handler, maxConns, maxPerIP int) *http.Server {
	cl := &connLimit{max: maxConns, maxPerIP: maxPerIP, perIP: map[string]int{}, open: map[net.Conn]string{}}
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second, // also bounds the TLS handshake
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      MaxWatch + 30*time.Second,
		IdleTimeout:       IdleTimeout,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxStreams},
		ConnState:         cl.track,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
}

// connLimit counts the server's open connections, in all and per remote
// address, and closes those beyond its limits.
type connLimit struct {
	mu            sync.Mutex
	max, maxPerIP int
	total         int
	perIP         map[string]int
	open          map[net.Conn]string // counted connections, by their address
}

func (l *connLimit) track(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateNew:
		ip := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
		l.open[c] = ip
		l.total++
		l.perIP[ip]++
		if l.total > l.max || l.perIP[ip] > l.maxPerIP {
			c.Close() // the server sees the handshake fail and reports StateClosed
		}
	case http.StateClosed, http.StateHijacked:
		ip, ok := l.open[c]
		if !ok {
			return
		}
		delete(l.open, c)
		l.total--
		if l.perIP[ip]--; l.perIP[ip] == 0 {
			delete(l.perIP, ip)
		}
	}
}
