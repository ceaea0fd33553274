package storage

import (
	"context"
	"fmt"
	"net"
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

func testWriteAcked(t *testing.T, pollNs int64) {
	p := parsePolicy(t, oneHostPolicy)
	_, req := Layout(p, "ds1")
	ds := &holdingDatastore{memDatastore: memDatastore{data: make([]byte, req)}, release: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &nbd.Server{Exports: nbd.MapExports{"": ds}}
	go srv.Serve(l)
	defer srv.Close()
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "nbd://" + l.Addr().String()}, Period: time.Hour, PollNs: pollNs})
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(gl)
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "tcp", gl.Addr().String(), "b/d0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	done := make(chan error, 1)
	go func() { done <- c.WriteAt([]byte("payload!"), 4096, true) }()
	// Wait (polling with a deadline) until the datastore holds the write.
	for ds.writes.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the write never reached the datastore")
		}
		time.Sleep(time.Millisecond)
	}
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
	// Disk b is the second disk: its region starts at 64 MiB.
	// (Under the datastore's lock: the write reached it through sockets,
	// which the race detector does not see as synchronisation.)
	ds.mu.RLock()
	got := string(ds.data[64<<20+4096 : 64<<20+4096+8])
	ds.mu.RUnlock()
	if got != "payload!" {
		t.Errorf("datastore holds %q at disk b's offset 4096", got)
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
	p := parsePolicy(t, oneHostPolicy)
	_, req := Layout(p, "ds1")
	ds := &holdingDatastore{memDatastore: memDatastore{data: make([]byte, req)}, release: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &nbd.Server{Exports: nbd.MapExports{"": ds}}
	go srv.Serve(l)
	defer srv.Close()
	defer close(ds.release) // before srv.Close: let the datastore's request end
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "nbd://" + l.Addr().String()}, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(gl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "tcp", gl.Addr().String(), "b/d0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.WriteAt([]byte("payload!"), 4096, false) }()
	for ds.writes.Load() == 0 { // polling with a deadline
		if ctx.Err() != nil {
			t.Fatal("the write never reached the datastore")
		}
		time.Sleep(time.Millisecond)
	}
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
