package storage

import (
	"context"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/ops"
	"sluice/internal/ops/opstest"
	"sluice/storage/nbd"
)

// slowVolume is a volume whose reads take d on the test's fake clock: a
// read advances the clock by d, so that the gateway measures latency d.
type slowVolume struct {
	*memDatastore
	clk *fakeClock
	d   time.Duration
}

func (v slowVolume) ReadAt(p []byte, off uint64) error {
	v.clk.Advance(v.d)
	return v.memDatastore.ReadAt(p, off)
}

// TestMetricsMatchStatus: after a control period with reads (3 ms each)
// and writes, the gateway's /metrics parses, passes the linter and gives
// every disk's and datastore's values from Status(); /readyz is 200 while
// the datastore answers and 503 once it is gone (after the next period).
func TestMetricsMatchStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := parsePolicy(t, oneHostPolicy)
	clk := newFakeClock(time.Unix(1000, 0))
	vols := newMemVolumes(p)
	ex := nbd.MapExports{}
	for n, v := range vols {
		ex[n] = v
	}
	ex["a+d0.img"] = slowVolume{vols["a+d0.img"], clk, 3 * time.Millisecond}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &nbd.Server{Exports: ex}
	go srv.Serve(l)
	defer srv.Close()
	periods := make(chan Status, 1)
	g, addr := serveGateway(t, p, l.Addr().String(), Options{Clock: clk, OnPeriod: func(s Status) { periods <- s }})
	clk.waitTickers(1)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(g))
	h := ops.Handler(reg, g.Ready, nil)

	io := func(export string, reads, writes int) {
		c, err := nbd.Dial(ctx, "tcp", addr, export)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range reads {
			if err := c.ReadAt(make([]byte, 4096), 0); err != nil {
				t.Fatal(err)
			}
		}
		for range writes {
			if err := c.WriteAt(make([]byte, 8192), 4096, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	io("a/d0", 4, 2)
	io("b/d0", 0, 1)
	period := func() Status {
		t.Helper()
		clk.Advance(time.Second)
		select {
		case st := <-periods:
			return st
		case <-ctx.Done():
			t.Fatal("the period did not end")
		}
		return Status{}
	}
	period()
	st := g.Status()
	fams := opstest.Scrape(t, h)
	opstest.Lint(t, reg)

	check := func(name string, want float64, labels ...string) {
		t.Helper()
		got, ok := fams.Value(name, labels...)
		if !ok {
			t.Errorf("%s%v: missing", name, labels)
		} else if math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	check("sluice_gateway_info", 1, "host", "h1")
	check("sluice_gateway_period_seconds", st.PeriodS)
	check("sluice_gateway_last_period_timestamp_seconds", float64(st.TimeUnixNs)/1e9)
	if len(st.Disks) != 4 {
		t.Fatalf("%d disks in the status", len(st.Disks))
	}
	for _, d := range st.Disks {
		l := []string{"disk", d.Disk, "datastore", d.Datastore}
		check("sluice_gateway_disk_entitlement_iops", d.EntitlementIOPS, l...)
		check("sluice_gateway_disk_reservation_iops", float64(d.ReservationIOPS), l...)
		if d.LimitIOPS > 0 {
			check("sluice_gateway_disk_limit_iops", float64(d.LimitIOPS), l...)
		} else if _, ok := fams.Value("sluice_gateway_disk_limit_iops", l...); ok {
			t.Errorf("%s unlimited has a limit", d.Disk)
		}
		check("sluice_gateway_disk_shares", float64(d.Shares), l...)
		check("sluice_gateway_disk_iops", d.IOPS, l...)
		check("sluice_gateway_disk_throughput_bytes_per_second", d.MBps*1e6, l...)
		check("sluice_gateway_disk_outstanding_requests", float64(d.Outstanding), l...)
		check("sluice_gateway_disk_reads_total", float64(d.ReadsTotal), l...)
		check("sluice_gateway_disk_writes_total", float64(d.WritesTotal), l...)
		check("sluice_gateway_disk_flush_failing", 0, l...)
		hist := fams.Metric("sluice_gateway_disk_latency_seconds", l...).GetHistogram()
		if hist.GetSampleCount() != d.Latency.Count || math.Abs(hist.GetSampleSum()-d.Latency.SumS) > 1e-12 {
			t.Errorf("%s latency: count %d sum %v, status %d %v", d.Disk, hist.GetSampleCount(), hist.GetSampleSum(), d.Latency.Count, d.Latency.SumS)
		}
		var cum uint64
		for i, b := range hist.GetBucket()[:len(LatencyBoundsS)] { // then +Inf
			cum += d.Latency.Counts[i]
			if b.GetUpperBound() != LatencyBoundsS[i] || b.GetCumulativeCount() != cum {
				t.Errorf("%s latency bucket %d: le %v count %d; status le %v count %d", d.Disk, i, b.GetUpperBound(), b.GetCumulativeCount(), LatencyBoundsS[i], cum)
			}
		}
	}
	// What the status says is what happened: a's 4 reads took 3 ms each
	// (≤ 5 ms bucket), its 2 writes and b's 1 no time; c's limit, d's
	// reservation.
	a := fams.Metric("sluice_gateway_disk_latency_seconds", "disk", "a/d0", "datastore", "ds1").GetHistogram()
	if a.GetSampleCount() != 6 || math.Abs(a.GetSampleSum()-0.012) > 1e-9 || a.GetBucket()[0].GetCumulativeCount() != 2 ||
		a.GetBucket()[5].GetCumulativeCount() != 2 || a.GetBucket()[6].GetCumulativeCount() != 6 {
		t.Errorf("a/d0 latency histogram %v", a)
	}
	check("sluice_gateway_disk_reads_total", 4, "disk", "a/d0", "datastore", "ds1")
	check("sluice_gateway_disk_writes_total", 2, "disk", "a/d0", "datastore", "ds1")
	check("sluice_gateway_disk_limit_iops", 100, "disk", "c/d0", "datastore", "ds1")
	check("sluice_gateway_disk_reservation_iops", 300, "disk", "d/d0", "datastore", "ds1")
	if v, _ := fams.Value("sluice_gateway_disk_iops", "disk", "a/d0", "datastore", "ds1"); v <= 0 {
		t.Errorf("a/d0 IOPS %v", v)
	}
	ds := st.Datastores[0]
	check("sluice_gateway_datastore_up", 1, "datastore", "ds1")
	check("sluice_gateway_datastore_window_requests", ds.Window, "datastore", "ds1")
	check("sluice_gateway_datastore_latency_seconds", ds.DatastoreLatencyMs/1e3, "datastore", "ds1")
	check("sluice_gateway_datastore_host_latency_seconds", ds.HostLatencyMs/1e3, "datastore", "ds1")
	check("sluice_gateway_datastore_host_iops", ds.HostIOPS, "datastore", "ds1")
	check("sluice_gateway_datastore_threshold_seconds", 0.030, "datastore", "ds1")
	check("sluice_gateway_datastore_outstanding_requests", float64(ds.Outstanding), "datastore", "ds1")
	check("sluice_gateway_datastore_hosts", float64(ds.HostsSeen), "datastore", "ds1")
	check("sluice_gateway_datastore_active_shares", ds.ActiveShares, "datastore", "ds1")
	if v, ok := fams.Value("sluice_gateway_datastore_measured_capacity_iops", "datastore", "ds1"); ok {
		t.Errorf("measured capacity %v of a datastore never congested, want the series absent", v)
	}
	if ds.HostsSeen != 1 || ds.HostIOPS <= 0 || ds.ActiveShares != 3000 {
		t.Errorf("datastore status %+v", ds)
	}

	if code, body := opstest.Get(h, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with the datastore up: %d %s", code, body)
	}
	if code, _ := opstest.Get(h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	srv.Close() // the datastore goes away
	period()
	code, body := opstest.Get(h, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: datastore ds1: stats volume: ") {
		t.Errorf("/readyz with the datastore gone: %d %q", code, body)
	}
	if v, _ := opstest.Scrape(t, h).Value("sluice_gateway_datastore_up", "datastore", "ds1"); v != 0 {
		t.Errorf("datastore_up %v with the datastore gone", v)
	}
	if code, _ := opstest.Get(h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the datastore gone: %d (liveness does not depend on it)", code)
	}
	clk.Advance(time.Minute) // past any retry, so that the gateway can close
}

// The histogram's buckets: a latency counts in the first bucket whose
// bound is at least the upper end of its log-linear bucket (at most
// 12.5% above it).
func TestLatencyHistogramBuckets(t *testing.T) {
	var p diskPeriod
	for _, ns := range []int64{0, 30e3, 49e3, 50e3, 60e3, 3e6, 9e6, 20e9} {
		p.ios++
		p.latSumNs += float64(ns)
		p.hist.add(ns)
	}
	var h LatencyHistogram
	h.add(&p)
	h.add(&diskPeriod{}) // an idle period adds nothing
	want := map[float64]uint64{50e-6: 3, 100e-6: 2, 5e-3: 1, 10e-3: 1}
	for i, le := range LatencyBoundsS {
		if h.Counts[i] != want[le] {
			t.Errorf("bucket le=%v: %d, want %d", le, h.Counts[i], want[le])
		}
	}
	if h.Counts[len(LatencyBoundsS)] != 1 || h.Count != 8 || math.Abs(h.SumS-20.012189) > 1e-9 {
		t.Errorf("overflow %d, count %d, sum %v", h.Counts[len(LatencyBoundsS)], h.Count, h.SumS)
	}
}

// The entitlement of one datastore's disks: floor semantics over the
// IOPS they completed; a disk that did not wait gets what it used.
func TestEntitleDisks(t *testing.T) {
	ds := []DiskStatus{
		{Disk: "vm1/d0", Shares: 1000, IOPS: 300},
		{Disk: "vm2/d0", Shares: 2000, LimitIOPS: 300, IOPS: 301},
		{Disk: "vm3/d0", Shares: 100, ReservationIOPS: 150, IOPS: 150},
		{Disk: "vm4/d0", Shares: 4000, IOPS: 10},
	}
	entitleDisks(ds, []bool{true, true, true, false})
	// 761 IOPS: vm4 its 10; vm3 its reservation 150 (its share of the
	// rest would be 19); vm2's share of 601 (1000:2000) is 400.7, its
	// limit 300; vm1 the rest, 301.
	for i, want := range []float64{301, 300, 150, 10} {
		if math.Abs(ds[i].EntitlementIOPS-want) > 1e-6 {
			t.Errorf("%s entitled to %v IOPS, want %v", ds[i].Disk, ds[i].EntitlementIOPS, want)
		}
	}
}
