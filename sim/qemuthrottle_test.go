package sim

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// passTimes submits reqs (bytes each) at the times given and returns when
// each left the throttle, in the order they left.
func passTimes(t *testing.T, iops float64, reqs []struct {
	atNs  int64
	bytes int64
}, extra func(e *Engine, q *qemuThrottle)) []string {
	t.Helper()
	e := NewEngine(1)
	var out []string
	q := &qemuThrottle{eng: e}
	q.pass = func(r *ioReq) { out = append(out, fmt.Sprintf("%d@%.1fms", r.bytes>>10, float64(e.NowNs())/1e6)) }
	q.set(iops)
	for _, r := range reqs {
		r := r
		e.At(r.atNs, func() { q.submit(&ioReq{bytes: r.bytes, t0Ns: e.NowNs()}) })
	}
	if extra != nil {
		extra(e, q)
	}
	e.Run(10 * Second)
	return out
}

type req = struct {
	atNs  int64
	bytes int64
}

func burst(n int, bytes int64) []req {
	r := make([]req, n)
	for i := range r {
		r[i] = req{0, bytes}
	}
	return r
}

// QEMU's bucket: a tenth of a second of the rate passes at once (a
// request leaves while the level is at most the bucket, then adds its
// unit), the rest leaves at the rate.
func TestQEMUThrottleBucket(t *testing.T) {
	got := passTimes(t, 100, burst(14, 4096), nil)
	want := "4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@0.0ms 4@10.0ms 4@20.0ms 4@30.0ms"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("got  %s\nwant %s", s, want)
	}
	// After a quiet second the bucket is empty again.
	got = passTimes(t, 100, append(burst(12, 4096), req{2 * Second, 4096}), nil)
	if s := got[len(got)-1]; s != "4@2000.0ms" {
		t.Errorf("after a quiet second: %s, want 4@2000.0ms", s)
	}
}

// An I/O counts max(1, bytes / 32 KiB) units, and requests leave in the
// order they came: a small one waits behind a large one.
func TestQEMUThrottleUnitsFIFO(t *testing.T) {
	// Rate 10: a bucket of 1 unit. 128 KiB = 4 units, then 4 KiB = 1.
	got := passTimes(t, 10, []req{{0, 4096}, {0, 128 << 10}, {0, 4096}, {0, 16 << 10}}, nil)
	// 4 KiB at 0 (level 1); 128 KiB at 0 (1 ≤ 1; level 5); the next
	// waits until the level is 1: 400 ms; then level 2: 500 ms.
	want := "4@0.0ms 128@0.0ms 4@400.0ms 16@500.0ms"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("got  %s\nwant %s", s, want)
	}
}

// Setting a throttle empties the bucket and looks at the queue again; 0
// is no throttle.
func TestQEMUThrottleSet(t *testing.T) {
	got := passTimes(t, 10, burst(6, 4096), func(e *Engine, q *qemuThrottle) {
		e.At(150*Second/1000, func() { q.set(20) })
		e.At(Second, func() {
			if q.waiting() != 0 {
				t.Errorf("%d still waiting at 1 s", q.waiting())
			}
		})
	})
	// Rate 10: 0, 0 (level 2), 100 ms (level 2 again); set 20 at 150 ms
	// empties the bucket (now 2 units): the three waiting leave at once
	// (levels 0, 1, 2).
	want := "4@0.0ms 4@0.0ms 4@100.0ms 4@150.0ms 4@150.0ms 4@150.0ms"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("got  %s\nwant %s", s, want)
	}
	got = passTimes(t, 0, burst(100, 1<<20), nil)
	if len(got) != 100 || got[99] != "1024@0.0ms" {
		t.Errorf("no throttle: %d passed, last %s", len(got), got[len(got)-1])
	}
}

// A disk behind its throttle: QEMU's counters count the wait in the
// throttle's queue in the I/O's time, as the VM's latency does. 16
// outstanding I/Os at a limit of 100 IOPS on an array that takes 1 ms
// wait 160 ms each (Little's law), and QEMU's counters say so.
func TestQEMUThrottleLatencyCounter(t *testing.T) {
	sc, err := ParseScenario("lat.yaml", []byte(`name: lat
seed: 1
duration: 20s
sample: 1s
policy:
  cluster: c
  hosts: [{name: h1, cpu: {cores: 4, mhz: 2800}, memory: 8GiB}]
  datastores:
    - {name: ds1, driver: throttle, sioc: {enabled: false}, array: {slots: 4, serviceTime: 1ms}}
  vms:
    - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, limitIOPS: 100}]}
workloads:
  - {name: io, type: iometer, disk: vm1/d0, outstanding: 16, ioSize: 4KiB}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Runs[0].sim
	dk := s.disks["vm1/d0"]
	if dk.tq.iops != 100 {
		t.Fatalf("throttle %v, want 100", dk.tq.iops)
	}
	iops := dk.iops.Rate(5*Second, 20*Second)
	lat := dk.lat.Mean(5*Second, 20*Second)
	qemuLat := float64(dk.ctr.TimeNs) / float64(dk.ctr.Ops) / 1e6
	if math.Abs(iops-100) > 1 {
		t.Errorf("IOPS %.1f, want 100", iops)
	}
	if math.Abs(lat-160) > 2 {
		t.Errorf("latency %.1f ms, want 160 (16 / 100 IOPS)", lat)
	}
	// The counters cover the whole run, from the first second's bucket.
	if math.Abs(qemuLat-160) > 10 {
		t.Errorf("QEMU's counters: %.1f ms per I/O, want about 160", qemuLat)
	}
	if dk.ctr.Ops != uint64(dk.iops.Rate(0, 20*Second)*20) {
		t.Errorf("counters %d ops, series %.0f", dk.ctr.Ops, dk.iops.Rate(0, 20*Second)*20)
	}
}
