package storage

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// memDatastore is an in-memory NBD export standing in for nbdkit.
type memDatastore struct {
	mu   sync.RWMutex
	data []byte
}

func (m *memDatastore) SizeBytes() uint64 { return uint64(len(m.data)) }
func (m *memDatastore) ReadAt(p []byte, off uint64) error {
	m.mu.RLock()
	copy(p, m.data[off:])
	m.mu.RUnlock()
	return nil
}
func (m *memDatastore) WriteAt(p []byte, off uint64, fua bool) error {
	m.mu.Lock()
	copy(m.data[off:], p)
	m.mu.Unlock()
	return nil
}
func (m *memDatastore) Flush() error             { return nil }
func (m *memDatastore) Trim(off, n uint64) error { return nil }

func serveMem(b *testing.B, sizeBytes uint64) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &nbd.Server{Exports: nbd.MapExports{"": &memDatastore{data: make([]byte, sizeBytes)}}}
	go s.Serve(l)
	b.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// BenchmarkReadDirect and BenchmarkReadGateway: 4 KiB reads at queue depth
// 1 straight to an in-process datastore vs through a gateway; the
// difference per op is the gateway's added latency (two extra loopback
// hops included).
func BenchmarkReadDirect(b *testing.B) {
	addr := serveMem(b, 64<<20)
	benchReads(b, addr, "")
}

func BenchmarkReadGateway(b *testing.B) {
	benchReads(b, benchGateway(b), "a/d0")
}

// benchGateway serves oneHostPolicy's disks through a gateway on 127.0.0.1
// in front of an in-process memory datastore, and returns its address.
func benchGateway(b *testing.B) string {
	p, err := parsePolicyB(oneHostPolicy)
	if err != nil {
		b.Fatal(err)
	}
	_, req := Layout(p, "ds1")
	ds := serveMem(b, req)
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "nbd://" + ds}, Period: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(l)
	b.Cleanup(func() { g.Close() })
	return l.Addr().String()
}

func benchReads(b *testing.B, addr, export string) {
	c, err := nbd.Dial(context.Background(), "tcp", addr, export)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.ReadAt(buf, uint64(i%1000)*4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadGatewayQD32: 32 reads in flight on one connection through the
// gateway (CPU cost per I/O; the datastore is an in-process memory export).
func BenchmarkReadGatewayQD32(b *testing.B) {
	c, err := nbd.Dial(context.Background(), "tcp", benchGateway(b), "b/d0")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetParallelism(16) // 2 procs × 16 = 32 goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		i := 0
		for pb.Next() {
			if err := c.ReadAt(buf, uint64(i%1000)*4096); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
