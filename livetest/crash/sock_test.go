package crash

import (
	"net"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// waitServing polls until a server accepts on the Unix socket of an
// nbd+unix URI (a socket file a killed gateway left behind exists but
// refuses connections).
func waitServing(t *testing.T, uri string, within time.Duration) {
	t.Helper()
	network, addr, _, err := nbd.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout(network, addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing accepts on %s after %s: %v", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
	}
}
