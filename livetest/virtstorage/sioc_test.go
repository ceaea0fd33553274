package virtstorage

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
)

// SIOC Test 3 (seed 002) with QEMU guests: hosts h1 and h2, disk shares
// 1000/1000 on h1 and 1000/2000 on h2 (host aggregates 2000:3000), control
// period 1 s. The seed's four VMs are two guests with two disks each here
// (vm1: a, b on h1; vm2: a, b on h2): the gateways schedule disks, and two
// TCG guests boot in half the time of four on this 2-vCPU machine.
//
// The datastore is an array of 2 slots × 4 ms (500 IOPS of 4 KiB) and the
// threshold issue 8's 12 ms. A TCG guest costs about a millisecond of the
// machine's CPU per I/O, so only a datastore of a few hundred IOPS is
// congested by guests whose CPU is not the bottleneck (with 1200 IOPS the
// guests could not fill it: the split followed the guests' CPU, not their
// shares). At the threshold the windows add up to latency × IOPS: 6 at
// 12 ms × 500 IOPS, 2.4 and 3.6 at 2:3, so the datastore's minWindow is 1
// (PARDA's default of 4 per host is sized for the seed's array of
// ~1600 IOPS; 4 × 500/1624 ≈ 1.2). A gateway keeps ⌈window⌉ requests at
// the datastore, 2 and 3 here: still 2:3.
// The windows' maximum is the default 256: a window grows only while its
// gateway fills it (parda.Controller.Hold), so it does not climb while the
// guests boot (before that rule the test needed a maximum of 32).
const siocPolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 12ms, controlPeriod: 1s, minWindow: 1}
    array: {slots: 2, serviceTime: 4ms}
vms:
  - name: vm1
    host: h1
    lab: {kind: qemu}
    disks: [{name: a, datastore: ds1, size: 64MiB, shares: 1000}, {name: b, datastore: ds1, size: 64MiB, shares: 1000}]
  - name: vm2
    host: h2
    lab: {kind: qemu}
    disks: [{name: a, datastore: ds1, size: 64MiB, shares: 1000}, {name: b, datastore: ds1, size: 64MiB, shares: 2000}]
`

// siocThresholdMs is the policy's congestion threshold.
const siocThresholdMs = 12

// maxIOPSOffWindow bounds how far, on average over the measured periods,
// the hosts' IOPS ratio may be from their window ratio: backlogged
// gateways that each keep their window of requests at the datastore get
// IOPS in its proportion (Little's law, one latency for all). In ten runs
// on the 2-CPU test machine the mean was 1.9–3.9%; with gateways keeping
// ⌈window⌉ requests, 12.6–21.2% (docs/storage.md).
const maxIOPSOffWindow = 0.08

// The measurement counts control periods, not seconds: siocSettle paired
// periods of both hosts after both guests' fio started are not counted
// (the windows settle: PARDA converges in periods, and on a loaded
// machine a period stretches to several seconds), then siocRun periods
// are measured; fio is stopped after them. siocMaxS bounds fio's run.
const (
	siocSettle = 12
	siocRun    = 15
	siocMaxS   = 150
)

// TestGuestSIOCTest3: fio in both guests at once, one job per disk (4 KiB
// random reads, queue depth 64: a backlog at the gateway that lasts
// through a second of a guest starved of CPU; direct I/O on /dev/vda and /dev/vdb, whose
// serial numbers are checked to be the policy's disks a and b). Over the
// measured periods: the median of the hosts' window ratio h2/h1 is 1.5 ±
// 15%, the hosts' IOPS follow their windows (maxIOPSOffWindow), the
// median datastore latency the threshold ± 25%, and each disk's
// share of the IOPS fio reports (fio's own per-second IOPS log over the
// measured periods) is 20/20/20/40% ± 15%.
func TestGuestSIOCTest3(t *testing.T) {
	l := upLab(t, "vss", siocPolicy)
	vms := []string{"vm1", "vm2"}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, vm := range vms {
		r, err := lab.GuestExec(ctx, l.P.Cluster, vm, "/bin/sh", "-c", "for d in vda vdb; do cat /sys/block/$d/serial; echo; done")
		if got := strings.Fields(string(r.Stdout)); err != nil || len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Fatalf("%s: serial numbers of vda, vdb = %q (%v), want a, b", vm, r.Stdout, err)
		}
	}
	// Job 1 is disk a, job 2 disk b: fio logs them as sioc_iops.1.log and
	// sioc_iops.2.log, one average per second.
	job := []string{"direct=1", "ioengine=libaio", "iodepth=64", "rw=randread", "bs=4k", "size=64M", "time_based",
		"runtime=" + strconv.Itoa(siocMaxS), "write_iops_log=sioc", "log_avg_msec=1000",
		"name=a", "filename=/dev/vda", "name=b", "filename=/dev/vdb"}

	machine := livelab.WatchMachine(t)
	var mu sync.Mutex
	starts := map[string]time.Time{}
	pids := map[string]int{}
	results := map[string]fioResult{}
	var wg sync.WaitGroup
	for _, vm := range vms {
		pid, err := l.StartFio(ctx, vm, job...)
		if err != nil {
			t.Fatalf("fio in %s: %v", vm, err)
		}
		starts[vm], pids[vm] = time.Now(), pid
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := l.WaitFio(ctx, vm, pid)
			mu.Lock()
			results[vm] = r
			mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	last := starts["vm1"]
	if starts["vm2"].After(last) {
		last = starts["vm2"]
	}

	// Watch both gateways until siocSettle+siocRun paired periods began
	// after the later fio start, then stop fio in both guests.
	sw := &statusWatch{l: l, hosts: [2]string{"h1", "h2"}}
	var after []statusSample
	for ended := false; !ended; {
		sw.poll()
		after = after[:0]
		for _, s := range sw.pairs() {
			if !s.begin.Before(last) {
				after = append(after, s)
			}
		}
		if len(after) >= siocSettle+siocRun {
			break
		}
		select {
		case <-done:
			ended = true
		case <-ctx.Done():
			ended = true
		case <-time.After(200 * time.Millisecond):
		}
	}
	if len(after) < siocSettle+siocRun {
		t.Fatalf("fio ended after %d control periods of both hosts, want %d (%d to settle, %d measured): %s",
			len(after), siocSettle+siocRun, siocSettle, siocRun, sw.lengths())
	}
	for _, vm := range vms {
		if _, err := lab.GuestExec(ctx, l.P.Cluster, vm, "/bin/sh", "-c", "kill -INT "+strconv.Itoa(pids[vm])); err != nil {
			t.Fatalf("stopping fio in %s: %v", vm, err)
		}
	}
	<-done
	measured := after[siocSettle : siocSettle+siocRun]
	from, to := measured[0].begin, measured[len(measured)-1].end
	t.Logf("%d paired periods after fio started (lengths %s); measured %s to %s; fio started %s and %s",
		len(after), sw.lengths(), from.Format("15:04:05.0"), to.Format("15:04:05.0"), starts["vm1"].Format("15:04:05.0"), starts["vm2"].Format("15:04:05.0"))

	var ratios, lats []float64
	follow := 0.0 // Σ |IOPS ratio / window ratio − 1| over the periods
	for _, s := range measured {
		t.Logf("period to %s: windows h1 %5.1f h2 %5.1f (ratio %.2f), datastore latency %5.1f ms, IOPS h1 %4.0f h2 %4.0f (ratio %.2f; %s)",
			s.end.Format("15:04:05.0"), s.window[0], s.window[1], s.window[1]/s.window[0], s.latMs, s.iops[0], s.iops[1], s.iops[1]/s.iops[0], s.disks)
		ratios = append(ratios, s.window[1]/s.window[0])
		lats = append(lats, s.latMs)
		follow += math.Abs((s.iops[1]/s.iops[0])/(s.window[1]/s.window[0]) - 1)
	}
	follow /= float64(len(measured))
	disks := []string{"vm1/a", "vm1/b", "vm2/a", "vm2/b"}
	iops := map[string]float64{}
	var total float64
	for _, vm := range vms {
		r := results[vm]
		if r.Exit == fioStopped && len(r.Jobs) == 2 {
			r.Err = nil // stopped by the test's SIGINT, its report complete
		}
		if r.Err != nil || len(r.Jobs) != 2 {
			t.Fatalf("fio in %s: %v (%d jobs): %s", vm, r.Err, len(r.Jobs), tail(r.Stderr, 5))
		}
		for name, j := range r.Jobs {
			if j.JobError != 0 {
				t.Fatalf("fio in %s, disk %s: job error %d: %s", vm, name, j.JobError, tail(r.Stderr, 5))
			}
		}
		for k, disk := range []string{"a", "b"} {
			v, n, err := l.fioIOPSBetween(ctx, vm, fmt.Sprintf("/tmp/sioc_iops.%d.log", k+1), from.Sub(starts[vm]), to.Sub(starts[vm]))
			if err != nil || n < siocRun/2 {
				t.Fatalf("fio's IOPS log of %s/%s: %v (%d seconds in the measured periods)", vm, disk, err, n)
			}
			iops[vm+"/"+disk] = v
			total += v
		}
	}
	want := map[string]float64{"vm1/a": 0.2, "vm1/b": 0.2, "vm2/a": 0.2, "vm2/b": 0.4}
	for _, d := range disks {
		vm, disk, _ := strings.Cut(d, "/")
		j := results[vm].Jobs[disk]
		t.Logf("%s: fio %.0f IOPS in the measured periods (%.1f%% of %.0f); over its whole run %.0f IOPS, mean latency %.1f ms; guest CPU usr %.0f%% sys %.0f%%",
			d, iops[d], 100*iops[d]/total, total, j.ReadIOPS, j.ReadLatMs, j.UsrCPU, j.SysCPU)
	}
	w, lat := median(ratios), median(lats)
	t.Logf("median window ratio h2/h1 %.2f (want 1.5 ± 15%%), median datastore latency %.1f ms (want %d ± 25%%), %d periods; load %s",
		w, lat, siocThresholdMs, len(ratios), loadavg())
	if !within(w, 1.5, 0.15) {
		t.Errorf("window ratio h2/h1 = %.2f, want 1.5 ± 15%% (aggregate shares 3000:2000)", w)
	}
	load := machine.Between(from, to)
	t.Logf("the hosts' IOPS ratio h2/h1 differed from their window ratio by %.1f%% on average over the periods (want ≤ %.0f%%); %s", 100*follow, 100*maxIOPSOffWindow, load)
	if follow > maxIOPSOffWindow {
		t.Errorf("the hosts' IOPS ratio h2/h1 differed from their window ratio by %.1f%% on average, want ≤ %.0f%%: a gateway did not keep its window of requests at the datastore (%s)", 100*follow, 100*maxIOPSOffWindow, load)
	}
	if !within(lat, siocThresholdMs, 0.25) {
		t.Errorf("datastore latency %.1f ms, want %d ms ± 25%%", lat, siocThresholdMs)
	}
	for _, d := range disks {
		if got := iops[d] / total; !within(got, want[d], 0.15) {
			t.Errorf("%s: %.1f%% of the IOPS fio reports, want %.0f%% ± 15%%", d, 100*got, 100*want[d])
		}
	}
}

// fioIOPSBetween is the mean of the per-second IOPS in a fio log in the
// guest whose seconds lie within [from, to] of fio's run, and how many
// seconds that was.
func (l *guestLab) fioIOPSBetween(ctx context.Context, vm, path string, from, to time.Duration) (float64, int, error) {
	r, err := lab.GuestExec(ctx, l.P.Cluster, vm, "/bin/cat", path)
	if err != nil {
		return 0, 0, err
	}
	es, err := livelab.ParseFioLog(r.Stdout)
	if err != nil {
		return 0, 0, fmt.Errorf("%s in %s: %v", path, vm, err)
	}
	sum, n := 0.0, 0
	for _, e := range es {
		end := time.Duration(e.Msec) * time.Millisecond
		if end-time.Second >= from && end <= to {
			sum += float64(e.Value)
			n++
		}
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("%s in %s: no second within %v–%v of fio's run (%d entries)", path, vm, from, to, len(es))
	}
	return sum / float64(n), n, nil
}

// statusSample is one control period of both hosts' gateways.
type statusSample struct {
	begin, end time.Time
	window     [2]float64
	iops       [2]float64
	latMs      float64 // datastore-wide, as h1 saw it
	disks      string  // each disk's IOPS at its gateway
}

// fioStopped is fio's exit status after a SIGINT ended its jobs (it
// still writes its report and logs).
const fioStopped = 128

// statusWatch reads both hosts' gateway status files and pairs their
// control periods.
type statusWatch struct {
	l     *guestLab
	hosts [2]string
	recs  [2]map[int64]statusRec
}

type statusRec struct {
	end                 time.Time
	period              time.Duration
	window, iops, latMs float64
	disks               string
}

// poll reads each host's latest period.
func (w *statusWatch) poll() {
	for i, h := range w.hosts {
		if w.recs[i] == nil {
			w.recs[i] = map[int64]statusRec{}
		}
		st, err := w.l.gatewayStatus(h)
		if err != nil || len(st.Datastores) == 0 {
			continue
		}
		d := st.Datastores[0]
		var dk []string
		for _, x := range st.Disks {
			dk = append(dk, fmt.Sprintf("%s %.0f", x.Disk, x.IOPS))
		}
		w.recs[i][st.TimeUnixNs] = statusRec{time.Unix(0, st.TimeUnixNs), time.Duration(st.PeriodS * 1e9), d.Window, d.HostIOPS, d.DatastoreLatencyMs, strings.Join(dk, ", ")}
	}
}

// pairs is each h1 period with the h2 period that ended nearest to it
// (the gateways' periods need not be in phase), in time order.
func (w *statusWatch) pairs() []statusSample {
	var out []statusSample
	for _, a := range w.recs[0] {
		var best *statusRec
		for _, b := range w.recs[1] {
			d := math.Abs(float64(a.end.Sub(b.end)))
			if d <= float64(a.period) && (best == nil || d < math.Abs(float64(a.end.Sub(best.end)))) {
				b := b
				best = &b
			}
		}
		if best != nil {
			out = append(out, statusSample{begin: a.end.Add(-a.period), end: a.end,
				window: [2]float64{a.window, best.window}, iops: [2]float64{a.iops, best.iops}, latMs: a.latMs,
				disks: a.disks + "; " + best.disks})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].end.Before(out[j].end) })
	return out
}

// lengths lists the paired periods' lengths (evidence of a loaded
// machine).
func (w *statusWatch) lengths() string {
	var ps []string
	for _, s := range w.pairs() {
		ps = append(ps, s.end.Sub(s.begin).Round(10*time.Millisecond).String())
	}
	return strings.Join(ps, " ")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }
