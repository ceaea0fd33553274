package storage

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"sluice/internal/cputime"
	"sluice/policy"
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

// serveDatastore serves be as the default export on 127.0.0.1 until the
// test ends and returns its address.
func serveDatastore(tb testing.TB, be nbd.Backend) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &nbd.Server{Exports: nbd.MapExports{"": be}}
	go s.Serve(l)
	tb.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// serveExports serves exports on 127.0.0.1 until the test ends and
// returns the address.
func serveExports(tb testing.TB, exports nbd.MapExports) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &nbd.Server{Exports: exports}
	go s.Serve(l)
	tb.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// memVolumes is an in-process NBD datastore: a memDatastore per volume of
// datastore ds1 of a policy, and the stats volume with an identity.
type memVolumes map[string]*memDatastore

func newMemVolumes(p *policy.Policy) memVolumes {
	m := memVolumes{StatsVolume: {data: make([]byte, StatsVolumeBytes)}}
	copy(m[StatsVolume].data, encodeHeader(datastoreID{1, 2, 3}))
	for _, v := range Volumes(p, "ds1") {
		m[v.Name()] = &memDatastore{data: make([]byte, v.SizeBytes)}
	}
	return m
}

// serve serves the volumes, those named in override by the backend given
// there, and returns the address.
func (m memVolumes) serve(tb testing.TB, override map[string]nbd.Backend) string {
	ex := nbd.MapExports{}
	for n, v := range m {
		ex[n] = v
	}
	for n, b := range override {
		ex[n] = b
	}
	return serveExports(tb, ex)
}

// slotOf returns the record of host in the stats volume.
func (m memVolumes) slotOf(host string) (statsRecord, bool) {
	st := m[StatsVolume]
	st.mu.RLock()
	defer st.mu.RUnlock()
	for k := 0; k < statsSlots; k++ {
		off := statsHeaderBytes + k*StatsSlotBytes
		if r, ok := decodeStatsRecord(st.data[off : off+StatsSlotBytes]); ok && r.Host == host {
			return r, true
		}
	}
	return statsRecord{}, false
}

// serveGateway serves host h1's disks of p through a gateway on 127.0.0.1
// in front of datastore ds1 at dsAddr, until the test ends.
func serveGateway(tb testing.TB, p *policy.Policy, dsAddr string, opts Options) (*Gateway, string) {
	opts.Host, opts.Policy, opts.Datastores = "h1", p, map[string]string{"ds1": "nbd://" + dsAddr}
	g, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.Close()
		tb.Fatal(err)
	}
	go g.Serve(l)
	tb.Cleanup(func() { g.Close() })
	return g, l.Addr().String()
}

// BenchmarkReadDirect and BenchmarkReadGateway: 4 KiB reads at queue depth
// 1 straight to an in-process datastore vs through a gateway; the
// difference per op is the gateway's added latency (two extra loopback
// hops included).
func BenchmarkReadDirect(b *testing.B) {
	addr := serveDatastore(b, &memDatastore{data: make([]byte, 64<<20)})
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
	_, addr := serveGateway(b, p, newMemVolumes(p).serve(b, nil), Options{Period: time.Second})
	return addr
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

// BenchmarkReadGatewayWithMetrics: the gateway's I/O path with metrics
// off and on, in one run. 4 KiB reads at queue depth 1 go through a
// gateway in chunks of 1000; every other chunk ends with a scrape of the
// gateway's metrics (Gather and text encoding), which is one scrape per
// 2000 I/Os — at the default 10-s scrape interval that is a gateway doing
// 200 IOPS, so a busier gateway pays less. Chunks alternate so that load
// from other processes falls on both alike. It reports the process CPU
// time (internal/cputime) per I/O of both kinds of chunk, their ratio, and
// what one scrape costs.
func BenchmarkReadGatewayWithMetrics(b *testing.B) {
	p, err := parsePolicyB(oneHostPolicy)
	if err != nil {
		b.Fatal(err)
	}
	g, addr := serveGateway(b, p, newMemVolumes(p).serve(b, nil), Options{Period: 100 * time.Millisecond})
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(g))
	scrape := func() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				b.Fatal(err)
			}
		}
	}
	c, err := nbd.Dial(context.Background(), "tcp", addr, "a/d0")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	const chunk = 1000
	var offCPU, onCPU, scrapeCPU int64
	var offN, onN, scrapes int
	b.ResetTimer()
	for i := 0; i < b.N; {
		on := (i/chunk)%2 == 1
		n := min(chunk, b.N-i)
		t0 := cputime.ProcessNs()
		for j := range n {
			if err := c.ReadAt(buf, uint64((i+j)%1000)*4096); err != nil {
				b.Fatal(err)
			}
		}
		i += n
		if !on {
			offCPU += cputime.ProcessNs() - t0
			offN += n
			continue
		}
		t1 := cputime.ProcessNs()
		scrape()
		t2 := cputime.ProcessNs()
		onCPU += t2 - t0
		onN += n
		scrapeCPU += t2 - t1
		scrapes++
	}
	b.StopTimer()
	if offN == 0 || onN == 0 {
		return // too few iterations for both kinds of chunk
	}
	off, onPer := float64(offCPU)/float64(offN), float64(onCPU)/float64(onN)
	b.ReportMetric(off, "off-cpu-ns/io")
	b.ReportMetric(onPer, "on-cpu-ns/io")
	b.ReportMetric(onPer/off, "cpu-ratio")
	b.ReportMetric(float64(scrapeCPU)/float64(scrapes), "scrape-cpu-ns")
}
