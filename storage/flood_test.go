package storage

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	"sluice/internal/nbdattack"
	"sluice/storage/nbd"
)

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
	stop, err := nbdattack.Flood(addr, 600, sources, time.Second)
	if err != nil {
		t.Fatalf("flood: %v", err)
	}
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
