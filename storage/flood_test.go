package storage

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// floodTLS holds n idle TCP connections to addr from the given local
// addresses (round robin), none of which ever starts TLS; a connection the
// gateway closes is opened again after reconnect. It returns once every
// connection was open at least once, with the function that stops them.
func floodTLS(t *testing.T, addr string, n int, sources []string, reconnect time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg, first sync.WaitGroup
	first.Add(n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(src string) {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			once := false
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					if !once {
						once = true
						errs <- err
						first.Done()
					}
					return
				}
				if !once {
					once = true
					first.Done()
				}
				stopRead := context.AfterFunc(ctx, func() { c.Close() })
				_, _ = io.Copy(io.Discard, c) // the greeting, then idle until closed
				stopRead()
				c.Close()
				select {
				case <-ctx.Done():
				case <-time.After(reconnect): // the attacker's reconnection interval
				}
			}
		}(sources[i%len(sources)])
	}
	first.Wait()
	close(errs)
	for err := range errs {
		cancel()
		wg.Wait()
		t.Fatalf("flood: %v", err)
	}
	return func() { cancel(); wg.Wait() }
}

// 600 idle TCP connections from six addresses, each opened again 1 s after
// the gateway closes it (the attack of issue 24 reconnected every 10 s),
// hold the TLS listener while a VM with a valid certificate opens its disk
// 20 times in a row, from one of the attackers' addresses, and reads
// through each connection: all 20 succeed. (Before the bounds on
// unauthenticated connections the 600 took the listener's 512 places and
// the opens failed.)
func TestGatewayTLSUnderConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 600 connections: skipped with -short")
	}
	g := newTestGateway(t)
	dir := t.TempDir()
	ca := writeTLSDirs(t, dir, "a")
	addr := serveTestTLS(t, g, dir)
	cp, err := ca.Client("a")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cp.TLS()}, RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	var sources []string
	for i := 1; i <= 6; i++ {
		sources = append(sources, fmt.Sprintf("127.0.0.%d", i))
	}
	stop := floodTLS(t, addr, 600, sources, time.Second)
	defer stop()
	ok := 0
	buf := make([]byte, 4096)
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		c, err := nbd.DialTLS(ctx, "tcp", addr, "a/d0", cfg)
		cancel()
		if err != nil {
			t.Errorf("open %d: %v (after %v)", i, err, time.Since(start))
			continue
		}
		if err := c.ReadAt(buf, uint64(i)*4096); err != nil {
			t.Errorf("open %d: read: %v", i, err)
		} else {
			ok++
		}
		c.Close()
	}
	t.Logf("%d of 20 TLS opens read their disk under the flood; %d unauthenticated connections displaced, %d refused",
		ok, g.srv.Displaced(), g.srv.Refused())
}
