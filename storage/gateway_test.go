package storage

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// holdingDatastore acknowledges writes only when told to, and counts
// flushes and FUA writes.
type holdingDatastore struct {
	memDatastore
	release chan struct{}
	writes  atomic.Int32 // writes received
	fua     atomic.Int32
	flushes atomic.Int32
}

func (h *holdingDatastore) WriteAt(p []byte, off uint64, fua bool) error {
	h.writes.Add(1)
	if fua {
		h.fua.Add(1)
	}
	<-h.release
	return h.memDatastore.WriteAt(p, off, fua)
}

func (h *holdingDatastore) Flush() error { h.flushes.Add(1); return nil }

// A write is acknowledged to the VM only after the datastore acknowledged
// it; FUA is passed on; FLUSH reaches the datastore. The same with bounded
// busy polling on (Options.PollNs).
func TestWriteAckedOnlyAfterDatastore(t *testing.T) {
	for _, pollNs := range []int64{0, 50_000} {
		t.Run(fmt.Sprintf("poll=%dns", pollNs), func(t *testing.T) { testWriteAcked(t, pollNs) })
	}
}

// heldWrite serves oneHostPolicy through a gateway (opts) in front of a
// holdingDatastore, and sends a write to disk b/d0 that the datastore
// holds; it returns when the datastore has it. done receives the write's
// result.
func heldWrite(t *testing.T, ctx context.Context, opts Options, fua bool) (ds *holdingDatastore, g *Gateway, c *nbd.Client, done chan error) {
	t.Helper()
	p := parsePolicy(t, oneHostPolicy)
	vols := newMemVolumes(p)
	ds = &holdingDatastore{memDatastore: memDatastore{data: make([]byte, 64<<20)}, release: make(chan struct{})}
	// Cleanups run last first: the held write is released before the
	// gateway and the datastore close (they wait for it).
	dsAddr := vols.serve(t, map[string]nbd.Backend{VolumeName("b", "d0"): ds})
	g, addr := serveGateway(t, p, dsAddr, opts)
	t.Cleanup(func() {
		select {
		case <-ds.release:
		default:
			close(ds.release)
		}
	})
	c, err := nbd.Dial(ctx, "tcp", addr, "b/d0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	done = make(chan error, 1)
	go func() { done <- c.WriteAt([]byte("payload!"), 4096, fua) }()
	for ds.writes.Load() == 0 { // polling with a deadline
		if ctx.Err() != nil {
			t.Fatal("the write never reached the datastore")
		}
		time.Sleep(time.Millisecond)
	}
	return ds, g, c, done
}

func testWriteAcked(t *testing.T, pollNs int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, _, c, done := heldWrite(t, ctx, Options{Period: time.Hour, PollNs: pollNs}, true)
	select {
	case err := <-done:
		t.Fatalf("write acknowledged (%v) before the datastore acknowledged it", err)
	default:
	}
	close(ds.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ds.fua.Load() != 1 {
		t.Errorf("FUA writes at the datastore: %d, want 1", ds.fua.Load())
	}
	// The write is in disk b's own volume, at the VM's offset.
	// (Under the datastore's lock: the write reached it through sockets,
	// which the race detector does not see as synchronisation.)
	ds.mu.RLock()
	got := string(ds.data[4096 : 4096+8])
	ds.mu.RUnlock()
	if got != "payload!" {
		t.Errorf("volume %s holds %q at offset 4096", VolumeName("b", "d0"), got)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if ds.flushes.Load() != 1 {
		t.Errorf("flushes at the datastore: %d, want 1", ds.flushes.Load())
	}
	// Out of the disk's range: refused by the gateway, not sent upstream.
	if err := c.WriteAt(make([]byte, 4096), 64<<20, false); err == nil {
		t.Error("write past the end of the disk accepted")
	}
}

// Close does not wait forever for a datastore that does not answer: after
// closeGrace the requests still there fail, and the VM's write was never
// acknowledged.
func TestCloseWithDatastoreStuck(t *testing.T) {
	defer func(d time.Duration) { closeGrace = d }(closeGrace)
	closeGrace = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, g, _, done := heldWrite(t, ctx, Options{Period: time.Hour}, false)
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close still waits for a datastore that does not answer")
	}
	if err := <-done; err == nil {
		t.Error("the VM's write was acknowledged though the datastore never answered")
	}
}
