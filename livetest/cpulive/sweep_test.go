package cpulive

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/agent"
	"sluice/cpuctl"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
	"sluice/sim"
)

// sweepCluster names the lab of TestSeed003Live.
const sweepCluster = "cpusw"

// sweepPolicy is seed 003's test bed in the lab: a sending QEMU guest (tx,
// 1 vCPU) and a receiving namespace VM (rx) on one host whose CPU is this
// machine's (2 cores at the clock /proc/cpuinfo gives: %d MHz). The
// traffic stays on the host's bridge, as the seed's stays on one port
// group.
const sweepPolicy = `cluster: ` + sweepCluster + `
hosts:
  - name: h1
    cpu: {cores: 2, mhz: %d}
    uplinks: [{name: up0, speed: 10Gbps}]
vms:
  - {name: tx, host: h1, cpu: {vcpus: 1}, lab: {kind: qemu}, nics: [{name: nic0}]}
  - {name: rx, host: h1, cpu: {vcpus: 1}, nics: [{name: nic0}]}
`

// sweepPcts are the sender's CPU limits in % of one of this machine's
// cores, after an unlimited point: 100% down to 15%, 9 points in all.
var sweepPcts = []int{100, 85, 70, 55, 45, 35, 25, 20, 15}

// sweepLimitsMHz are sweepPcts in MHz of a core of coreMHz.
func sweepLimitsMHz(coreMHz int) []int {
	var out []int
	for _, p := range sweepPcts {
		out = append(out, (p*coreMHz+50)/100)
	}
	return out
}

// Per point: once the agent set the limit and the flow is steady
// (waitSteady: two seconds, which are counted), sweepMeasureS more seconds
// counted for an unlimited point; a limit is measured twice, on the way
// down and on the way up, sweepHalfS more seconds each time. sweepWarmupS
// of flow before the first point.
const (
	sweepWarmupS  = 6
	sweepMeasureS = 4
	sweepHalfS    = 1
	sweepStreams  = 4 // as the seed's iperf: four threads
)

// sweepOut is where the test writes its points for the reproduction
// report (scripts/reproduce.sh), relative to the module's root.
const sweepOut = "out/live/cpu-limit-sweep"

// TestSeed003Live is seed 003 on a real QEMU guest: the guest sends iperf3
// (the client runs in the guest through its guest agent, 4 streams in
// MTU-sized segments (guestMTUSegments), one flow for the whole sweep) to a namespace VM on the same host while the
// agent (sluice agent --cpu, run in this process on the lab's inventory)
// sets the guest's CPU limit from the policy: unlimited, sweepPcts of a
// core down to 15% and back up, unlimited. The guest's whole QEMU process is in its lab cgroup
// (lab.VMCgroup), so the limit is the cfs quota of everything the guest
// costs the host. The rate is what the receiver's sockets received over
// the counted seconds, timed by the host (a throttled TCG guest's own
// clock falls behind: iperf3's 5 s took 27 s at 15%). Everything is
// judged against what this run measured on this machine, never against a
// figure from another one; a point that the rest of the machine disturbed
// (disturbedCores) is measured again, and a verdict that fails with
// disturbed points left says so, with the machine's figures. It asserts:
//
//   - the limit held at each point: the guest used at most its allocation
//     (limitSlack);
//   - the limits bound: at least minCPUBound of the eight limited points
//     sent less than CPUBoundFraction of the unlimited rate (a limit the
//     guest sends as much under as without one does not bind: something
//     else held the flow, and the point says nothing of the cost of
//     sending);
//   - throughput against the limit is a straight line over the limited
//     points, R² ≥ 0.95;
//   - the ready-time analog (run-queue wait of the QEMU threads,
//     /proc/TID/schedstat) rises as the limit falls: over the limited
//     points its rank correlation with the limit is at most readyRho
//     (a strong falling trend; near 15% it saturates: the vCPU thread
//     waits all the time, about 100%, and 4-s windows then differ by up
//     to 16 points either way, so neighbours are not compared one by
//     one), and the ready % at 15% is at least 50 points above the
//     unlimited point's;
//   - the simulator with its CPU model calibrated to this run (the
//     figures of the line and the unlimited point, set once: the scenario
//     out/live/cpu-limit-sweep-lab.yaml, which scripts/calibrate-cpu.sh
//     makes the simulator's calibration) gives the slope of this run
//     within 15%.
//
// It writes the points, a plot beside the seed's and a report section to
// out/live/cpu-limit-sweep.*.
func TestSeed003Live(t *testing.T) {
	tree := requireSweep(t)
	coreMHz := machineCoreMHz(t)
	p, err := policy.Parse("sweep.yaml", []byte(fmt.Sprintf(sweepPolicy, coreMHz)))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_ = lab.Down(sweepCluster, dir) // a crashed run's
	t.Cleanup(func() {
		if err := lab.Down(sweepCluster, dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	t0 := time.Now()
	if _, err := lab.Up(p, lab.Options{StateDir: dir, GuestTTL: 5 * time.Minute, FirmwareBoot: true}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Logf("lab up in %v; a core of this machine: %d MHz", time.Since(t0).Round(100*time.Millisecond), coreMHz)
	txGroup, rxGroup := lab.VMCgroup(pl, "tx"), lab.VMCgroup(pl, "rx")
	if pids, err := tree.Procs(txGroup); err != nil || len(pids) != 1 {
		t.Fatalf("cgroup %s holds %v (%v), want the guest's QEMU process", txGroup, pids, err)
	}

	policies := make(chan *policy.Policy, 1)
	runSweepAgent(t, pl, p, tree, policies)

	f := startFlow(t, tree, pl, rxGroup)
	// The TCG guest sends more per cycle as its translated code warms:
	// the flow runs sweepWarmupS before the first point, and the unlimited
	// point is measured at both ends of the sweep and averaged.
	time.Sleep(sweepWarmupS * time.Second) // the guest's warm-up, a traffic schedule
	var pts []sim.SweepPoint
	var disturbed []string
	busy := 0.0
	// Each limit is measured on the way down and again on the way up,
	// and the two are averaged: the guest's rate per cycle drifts over a
	// sweep (the unlimited point moved by -23% to +15% from one end to
	// the other in failing runs, docs/testing.md), and a limit's two
	// measurements lie on either side of the sweep's middle.
	limits := sweepLimitsMHz(coreMHz)
	order := append([]int{0}, limits...)
	for i := len(limits) - 1; i >= 0; i-- {
		order = append(order, limits[i])
	}
	order = append(order, 0)
	var first, last sim.SweepPoint
	byLimit := map[int][]sim.SweepPoint{}
	for i, lim := range order {
		policies <- withTxLimit(p, lim)
		waitQuota(t, tree, txGroup, lim, coreMHz)
		window := sweepHalfS
		if lim == 0 {
			window = sweepMeasureS
		}
		pt := f.measure(t, tree, txGroup, lim, coreMHz, window)
		switch {
		case i == 0:
			first = pt.SweepPoint
		case i == len(order)-1:
			last = pt.SweepPoint
		default:
			byLimit[lim] = append(byLimit[lim], pt.SweepPoint)
		}
		busy += pt.others / float64(len(order))
		if pt.disturbed {
			disturbed = append(disturbed, fmt.Sprintf("%d MHz: %s", lim, pt.machine))
		}
	}
	f.stop(t)
	pts = []sim.SweepPoint{meanPoint(first, last)}
	for _, lim := range limits {
		m := byLimit[lim]
		pts = append(pts, meanPoint(m[0], m[1]))
		t.Logf("%d MHz: %.1f Mbps down, %.1f up: %.1f", lim, 1000*m[0].Gbps, 1000*m[1].Gbps, 1000*pts[len(pts)-1].Gbps)
	}
	t.Logf("unlimited at the start %.1f Mbps (%.1f%% of a core), at the end %.1f Mbps (%.1f%%): %.1f Mbps at %.1f%% for the sweep",
		1000*first.Gbps, first.UsedPct, 1000*last.Gbps, last.UsedPct, 1000*pts[0].Gbps, pts[0].UsedPct)
	// A verdict below that fails with points the machine disturbed in
	// every try says so: the machine's evidence, beside sluice's figures.
	if len(disturbed) > 0 {
		t.Logf("%d point(s) disturbed by the machine in all %d tries: %s", len(disturbed), pointTries, strings.Join(disturbed, "; "))
		defer func() {
			if t.Failed() {
				t.Errorf("the machine disturbed %d of the %d points in all %d tries (other programs used more than %.0f%% of a core while tasks waited for a CPU more than %.0f%% of the time): %s",
					len(disturbed), len(pts), pointTries, 100*disturbedCores, 100*disturbedWait, strings.Join(disturbed, "; "))
			}
		}()
	}

	for _, lim := range limits {
		for _, pt := range byLimit[lim] {
			if pt.UsedPct > pt.AllocPct*(1+limitSlack) {
				t.Errorf("limit %d MHz (%.0f%% of a core) did not hold: the guest used %.1f%% of a core", pt.LimitMHz, pt.AllocPct, pt.UsedPct)
			}
		}
	}
	bound := cpuBound(pts)
	if len(bound) < minCPUBound {
		t.Fatalf("only %d of %d limited points sent less than %.0f%% of the unlimited %.1f Mbps: the CPU limits did not hold the guest",
			len(bound), len(pts)-1, 100*CPUBoundFraction, 1000*pts[0].Gbps)
	}
	if n := len(pts) - 1 - len(bound); n > 0 {
		t.Logf("%d limited point(s) sent ≥ %.0f%% of the unlimited rate: the limit did not bind there, left out of the slope", n, 100*CPUBoundFraction)
	}

	// Linear over the limits. The unlimited guest is another regime: its
	// QEMU I/O thread runs beside the vCPU (it used 111-116% of a core in
	// every run), so a limit of 100% already throttles it, and how much
	// that costs varied from run to run (the 100% point sent 55-97% of
	// the unlimited rate): logged with the fit over all points, not judged.
	_, _, r2all := sim.FitSweep(pts)
	slope, icpt, r2 := sim.FitSweep(limited(pts))
	t.Logf("fit over the limited points: %.3f Mbps per %% of a core, intercept %.1f Mbps, R² %.4f (over all points, the unlimited one included: R² %.4f)", 1000*slope, 1000*icpt, r2, r2all)
	if !(r2 >= 0.95) {
		t.Errorf("throughput against the CPU limit is not linear: R² %.4f < 0.95 over the limited points (points above)", r2)
	}
	ls, lc, _ := sim.FitSweep(bound)
	cal := calibrate(ls, lc, pts[0].UsedPct, coreMHz)
	t.Logf("CPU-bound points: %.3f Mbps per %% of a core, intercept %.1f Mbps: %.0f MHz per Gbps above %.0f MHz; as the simulator's model: cyclesPerByte %.2f, overheadMHz %.0f, peakMHz %.0f",
		1000*ls, 1000*lc, cal.mhzPerGbps, cal.OverheadMHz, cal.CyclesPerByte, cal.OverheadMHz, cal.PeakMHz)
	// Throttled by cfs, a TCG guest sends less per cycle than unthrottled
	// (measured here: the unlimited point 5–17% above the line of the
	// limited ones): logged, not judged.
	pred := ls*pts[0].UsedPct + lc
	t.Logf("the line at the unlimited guest's %.1f%% of a core: %.1f Mbps, measured %.1f (%+.1f%%)", pts[0].UsedPct, 1000*pred, 1000*pts[0].Gbps, 100*(pred/pts[0].Gbps-1))

	var lim, rdy []float64
	for _, pt := range pts[1:] {
		lim = append(lim, float64(pt.LimitMHz))
		rdy = append(rdy, pt.ReadyPct)
	}
	rho := spearman(lim, rdy)
	rise := pts[len(pts)-1].ReadyPct - pts[0].ReadyPct
	t.Logf("ready: Spearman ρ(limit, ready) %.3f; %.1f%% at 15%% vs %.1f%% unlimited (+%.1f points)", rho, pts[len(pts)-1].ReadyPct, pts[0].ReadyPct, rise)
	if !(rho <= readyRho) {
		t.Errorf("ready time does not rise as the limit falls: Spearman ρ(limit, ready) %.3f over the limited points, want ≤ %.1f", rho, readyRho)
	}
	if !(rise >= 50) {
		t.Errorf("ready time at 15%% is only %.1f points above unlimited (want ≥ 50)", rise)
	}

	// The simulator, its model calibrated once to this run, gives its
	// slope.
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	scen := filepath.Join(root, sweepOut+"-lab.yaml")
	if err := writeCalibration(scen, cal, pts, coreMHz); err != nil {
		t.Fatalf("calibration scenario: %v", err)
	}
	simPts := simulateLab(t, scen, coreMHz)
	ss, _, _ := sim.FitSweep(cpuBound(simPts))
	dev := ss/ls - 1
	t.Logf("slope: live %.3f, the simulator calibrated to this run (%s) %.3f Mbps per %% of a core: %+.1f%%", 1000*ls, scen, 1000*ss, 100*dev)
	if math.Abs(dev) > 0.15 {
		t.Errorf("the simulator, calibrated to this run, gives %.3f Mbps per %% of a core where the guest gave %.3f (%+.1f%%, want within 15%%)", 1000*ss, 1000*ls, 100*dev)
	}
	writeSweep(t, root, pts, simPts, r2, ls, ss, busy, coreMHz)
}

// readyRho is the rank correlation of ready % with the limit that the
// limited points must reach: 1 tie-free swap of neighbours among the 8
// gives -0.976, the runs of 2026-11-26 gave -0.95 to -1.0.
const readyRho = -0.8

// meanPoint is the mean of two measurements of the same limit.
func meanPoint(a, b sim.SweepPoint) sim.SweepPoint {
	m := a
	m.Gbps, m.UsedPct, m.ReadyPct, m.ThrottledPct = (a.Gbps+b.Gbps)/2, (a.UsedPct+b.UsedPct)/2, (a.ReadyPct+b.ReadyPct)/2, (a.ThrottledPct+b.ThrottledPct)/2
	if a.LimitMHz == 0 {
		m.AllocPct = m.UsedPct
	}
	return m
}

// limitSlack is how far above its allocation a limited guest's measured
// use may be: the cfs quota is exact per period, and a counted window
// (3 s or more) does not end on a period's boundary.
const limitSlack = 0.05

// machineCoreMHz is this machine's core clock as /proc/cpuinfo gives it:
// the unit of the limits (a limit is a share of a core).
func machineCoreMHz(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz >= 100 {
				return int(math.Round(mhz))
			}
		}
	}
	t.Fatal("/proc/cpuinfo gives no cpu MHz: the limits need a core's clock")
	return 0
}

// calibration is the simulator's CPU model (models.cpu) fitted to one run.
type calibration struct {
	CyclesPerByte, OverheadMHz, PeakMHz float64
	mhzPerGbps                          float64
}

// calibrate turns the line of the CPU-bound points (slope Gbps per % of a
// core, intercept Gbps) and the unlimited guest's use (% of a core) into
// the simulator's model: MHz per Gbps above an overhead, and the clock of
// an unlimited vCPU.
func calibrate(slope, icpt, unlimitedPct float64, coreMHz int) calibration {
	mhzPerPct := float64(coreMHz) / 100
	c := calibration{mhzPerGbps: mhzPerPct / slope, OverheadMHz: -icpt / slope * mhzPerPct, PeakMHz: unlimitedPct * mhzPerPct}
	c.CyclesPerByte = c.mhzPerGbps * 8 / 1000
	c.OverheadMHz = max(c.OverheadMHz, 0)
	return c
}

// simulateLab runs a calibration scenario and returns its points.
func simulateLab(t *testing.T, file string, coreMHz int) []sim.SweepPoint {
	t.Helper()
	sc, err := sim.LoadScenario(file)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := res.Sweep(float64(coreMHz))
	if err != nil {
		t.Fatal(err)
	}
	return pts
}

// limited drops the unlimited point.
func limited(pts []sim.SweepPoint) []sim.SweepPoint {
	var out []sim.SweepPoint
	for _, p := range pts {
		if p.LimitMHz > 0 {
			out = append(out, p)
		}
	}
	return out
}

// A limited point is CPU-bound when it sends less than CPUBoundFraction of
// the unlimited point (pts[0]); the slope needs minCPUBound of them.
const (
	CPUBoundFraction = 0.95
	minCPUBound      = 6
)

// cpuBound returns the limited points that are CPU-bound.
func cpuBound(pts []sim.SweepPoint) []sim.SweepPoint {
	var out []sim.SweepPoint
	for _, p := range limited(pts) {
		if p.Gbps < CPUBoundFraction*pts[0].Gbps {
			out = append(out, p)
		}
	}
	return out
}

// runSweepAgent runs the agent of h1 with the lab's inventory and the
// machine's cgroups (static mode, 100 ms steps), taking new policies from
// policies.
func runSweepAgent(t *testing.T, pl *lab.Plan, p *policy.Policy, tree cpuctl.Tree, policies chan *policy.Policy) {
	t.Helper()
	k, err := agent.NewNetlinkKernel(pl.Host("h1").Name)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := pl.Inventory("h1")
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Cgroups: tree, Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var mu sync.Mutex
	var lastErr error
	go func() {
		defer close(done)
		_ = agent.Run(ctx, a, nil, agent.NowNs(), (100 * time.Millisecond).Nanoseconds(), func(_ agent.Stats, _ agent.Changes, err error) {
			if err != nil {
				mu.Lock()
				lastErr = err
				mu.Unlock()
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		k.Close()
		if lastErr != nil {
			t.Errorf("agent step failed: %v", lastErr)
		}
	})
}

// withTxLimit is p with the sender's CPU limit set (0: unlimited).
func withTxLimit(p *policy.Policy, mhz int) *policy.Policy {
	q := *p
	q.VMs = append([]policy.VM(nil), p.VMs...)
	for i := range q.VMs {
		if q.VMs[i].Name == "tx" {
			q.VMs[i].CPU.LimitMHz = mhz
		}
	}
	return &q
}

// waitQuota polls the group's cfs quota until the agent set the limit
// (-1 when unlimited), for at most 5 s.
func waitQuota(t *testing.T, tree cpuctl.Tree, group string, mhz, coreMHz int) {
	t.Helper()
	want := int64(-1)
	if mhz > 0 {
		want = (int64(mhz)*cpuctl.DefaultPeriodUs + int64(coreMHz) - 1) / int64(coreMHz)
	}
	file := filepath.Join(tree.Dir(group), "cpu.cfs_quota_us")
	if _, ok := tree.(cpuctl.V2); ok {
		file = filepath.Join(tree.Dir(group), "cpu.max")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(file)
		have := strings.Fields(string(b))
		if err == nil && len(have) > 0 {
			q := have[0]
			if (want < 0 && (q == "-1" || q == "max")) || q == strconv.FormatInt(want, 10) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not set the limit %d MHz on %s within 5 s: %s holds %q (%v), want quota %d", mhz, group, file, b, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// flow is the guest's iperf3 flow to the receiving VM: one flow for the
// whole sweep, as the limit changes under it.
type flow struct {
	pl      *lab.Plan
	rxGroup string
	addr    string // the server's IP:PORT
	srv     *exec.Cmd
	pid     int // the client's pid in the guest
}

// startFlow starts a one-off iperf3 server in the receiving VM (in its
// cgroup) and the iperf3 client in the guest through the guest agent
// (lab.GuestStart), sweepStreams streams for far longer than the sweep,
// and returns once the streams are connected.
func startFlow(t *testing.T, tree cpuctl.Tree, pl *lab.Plan, rxGroup string) *flow {
	t.Helper()
	rx := pl.NIC("rx/nic0")
	port := strconv.Itoa(rx.IperfPort)
	f := &flow{pl: pl, rxGroup: rxGroup, addr: rx.IP.String() + ":" + port}
	f.srv = exec.Command("ip", "netns", "exec", pl.VM("rx").Name, "iperf3", "-s", "-1", "-B", rx.IP.String(), "-p", port)
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.srv.Process.Kill() }) // when the test fails before stop
	if err := tree.Attach(rxGroup, f.srv.Process.Pid); err != nil {
		t.Logf("receiver not in %s: %v", rxGroup, err)
	}
	waitListening(t, pl.VM("rx").Name, f.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := lab.GuestStart(ctx, sweepCluster, "tx", "/bin/sh", "-c", guestMTUSegments)
	if err == nil {
		_, err = lab.GuestWait(ctx, sweepCluster, "tx", pid)
	}
	if err != nil {
		t.Fatalf("segmentation offload off in the guest: %v", err)
	}
	f.pid, err = lab.GuestStart(ctx, sweepCluster, "tx", "/usr/bin/iperf3", "-c", rx.IP.String(), "-p", port,
		"-P", strconv.Itoa(sweepStreams), "-t", "3600")
	if err != nil {
		t.Fatalf("iperf3 client in the guest: %v", err)
	}
	waitEstablished(t, pl.VM("rx").Name, f.addr, 1+sweepStreams)
	return f
}

// guestMTUSegments turns segmentation offload off on the guest's network
// devices (GSO of one segment at most): TCP then hands the device
// MTU-sized packets whatever its pacing rate, so that a byte costs the
// same cycles all through the sweep. With offload, TCP sizes its
// segments from its pacing rate, which follows the flow's history: the
// unlimited guest sent 0.94 Gbps before the sweep and 0.52 after it at
// the same 110–114% of a core (CI, 2026-11-26), and the limited points'
// rates were off their line by up to 30%.
const guestMTUSegments = `for d in /sys/class/net/*; do n=${d##*/}; [ "$n" = lo ] || ip link set dev "$n" gso_max_segs 1 gso_max_size 1500 || exit 1; done`

// stop ends the flow: the server is killed, the client in the guest then
// fails on its connections and exits.
func (f *flow) stop(t *testing.T) {
	t.Helper()
	_ = f.srv.Process.Kill()
	_ = f.srv.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := lab.GuestWait(ctx, sweepCluster, "tx", f.pid); err == nil || res.Exit == 0 {
		t.Logf("the guest's iperf3 client ended with %v (exit %d) when its server was killed", err, res.Exit)
	}
}

// diagnose says what the flow's ends are doing: whether the guest's
// client still runs (and its output if it ended) and the receiver's
// sockets as ss shows them.
func (f *flow) diagnose() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	client := "the guest's iperf3 client still runs"
	if res, err := lab.GuestWait(ctx, sweepCluster, "tx", f.pid); err == nil || res.Exit != 0 {
		client = fmt.Sprintf("the guest's iperf3 client ended (%v): %q", err, tailString(string(res.Stdout), 300))
	} else if ctx.Err() == nil {
		client = fmt.Sprintf("the guest's iperf3 client: %v", err)
	}
	out, err := lab.Exec(context.Background(), f.pl.VM("rx").Name, "ss", "-Htin", "src", f.addr)
	return fmt.Sprintf("%s; the receiver's sockets (%v): %q", client, err, tailString(string(out), 600))
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// received is the payload the receiver's sockets of the flow have
// received (ss's bytes_received, summed): timed by the host, whatever the
// guest's clock does (a throttled TCG guest's clock falls behind).
func (f *flow) received(t *testing.T) uint64 {
	t.Helper()
	out, err := lab.Exec(context.Background(), f.pl.VM("rx").Name, "ss", "-Htin", "state", "established", "src", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, m := range bytesReceived.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseUint(m[1], 10, 64)
		sum += v
	}
	return sum
}

var bytesReceived = regexp.MustCompile(`bytes_received:(\d+)`)

// A point is disturbed when, while it was counted, programs other than
// the guest and its receiver, at normal priority (niced ones yield to
// them), used more than disturbedCores of the machine's CPUs while some
// task waited for a CPU more than disturbedWait of the time (PSI), or
// when the hypervisor under this machine took more than disturbedSteal
// of a core (steal): the machine, not the limit, then set part of the
// rate (the sending path's kernel work competes; a stolen vCPU stalls the
// guest and its receiver at random). A disturbed point is measured
// again, up to pointTries times.
const (
	disturbedCores = 0.20
	disturbedWait  = 0.10
	disturbedSteal = 0.05
	pointTries     = 3
)

// point is one measured point with the machine's load meanwhile.
type point struct {
	sim.SweepPoint
	others    float64 // cores used by the rest of the machine, the receiver included
	rxCores   float64 // of which by the receiver
	machine   livelab.Load
	disturbed bool
}

// measure measures the guest's cgroup and the flow over sweepMeasureS
// once the flow is steady at the current limit, again when the machine
// disturbed the point (see disturbedCores).
func (f *flow) measure(t *testing.T, tree cpuctl.Tree, txGroup string, limitMHz, coreMHz, windowS int) point {
	t.Helper()
	var pt point
	for try := 1; try <= pointTries; try++ {
		pt = f.measureOnce(t, tree, txGroup, limitMHz, coreMHz, windowS)
		if !pt.disturbed {
			return pt
		}
		t.Logf("  the machine disturbed this point (%s); measuring it again", pt.machine)
	}
	return pt
}

func (f *flow) measureOnce(t *testing.T, tree cpuctl.Tree, txGroup string, limitMHz, coreMHz, windowS int) point {
	t.Helper()
	w0 := f.waitSteady(t, tree, txGroup, limitMHz)
	time.Sleep(time.Duration(windowS) * time.Second) // the counting window
	w1 := f.snap(t, tree, txGroup)
	el := w1.m.At.Sub(w0.m.At)
	if w1.bytes <= w0.bytes {
		t.Fatalf("limit %d MHz: the receiver got nothing in %v (bytes_received %d → %d)", limitMHz, el, w0.bytes, w1.bytes)
	}
	gbps := float64(w1.bytes-w0.bytes) * 8 / el.Seconds() / 1e9
	r := w1.tx.Rates(w0.tx, el.Nanoseconds())
	load := w1.m.Since(w0.m)
	others := max(load.BusyCores-r.UsedCores, 0)
	rxUsed := w1.rx.Rates(w0.rx, el.Nanoseconds()).UsedCores
	s1 := w1.tx
	pt := point{SweepPoint: sim.SweepPoint{LimitMHz: limitMHz, Gbps: gbps, UsedPct: 100 * r.UsedCores, ReadyPct: r.ReadyPct, ThrottledPct: 100 * r.ThrottledFrac},
		others: others, rxCores: rxUsed, machine: load}
	pt.disturbed = others-rxUsed-load.NiceCores > disturbedCores && load.WaitShare > disturbedWait ||
		load.StealCores > disturbedSteal
	pt.AllocPct = 100 * float64(limitMHz) / float64(coreMHz)
	name := fmt.Sprintf("%d MHz (%.0f%%)", limitMHz, pt.AllocPct)
	if limitMHz == 0 {
		pt.AllocPct = pt.UsedPct
		name = "unlimited"
	}
	t.Logf("%-16s %.1f Mbps over %.1f s; guest used %.1f%% of a core, ready %.1f%% (%d threads), throttled %.1f%%; the receiver used %.1f%% of a core, the rest of the machine (receiver included) %.1f%%, the hypervisor stole %.1f%%, some task waited for a CPU %.0f%% of the time",
		name, 1000*gbps, el.Seconds(), pt.UsedPct, pt.ReadyPct, s1.Threads, pt.ThrottledPct, 100*rxUsed, 100*others, 100*load.StealCores, 100*max(load.WaitShare, 0))
	return pt
}

// Before a point is counted the flow must be steady at its limit: its
// rate over two consecutive seconds within steadyTol of each other (the
// flow ramped up, the new quota took hold), for at most steadyWithin.
// Those two seconds are the start of the point's counted window.
const (
	steadyTol    = 0.10
	steadyWithin = 20 * time.Second
)

// snapshot is the flow's receiver, both VMs' cgroups and the machine at
// one instant.
type snapshot struct {
	m      livelab.MachineSample
	bytes  uint64
	tx, rx cpuctl.Stats
}

func (f *flow) snap(t *testing.T, tree cpuctl.Tree, txGroup string) snapshot {
	t.Helper()
	s := snapshot{m: livelab.SampleMachine()}
	var err error
	if s.tx, err = tree.Stats(txGroup); err != nil {
		t.Fatal(err)
	}
	s.rx, _ = tree.Stats(f.rxGroup)
	s.bytes = f.received(t)
	return s
}

// waitSteady waits until the receiver's rate is steady (see steadyTol),
// taking a snapshot every 250 ms, and returns the snapshot that starts
// the two steady seconds; it fails the test with the rates and the
// machine's load when the flow did not settle.
func (f *flow) waitSteady(t *testing.T, tree cpuctl.Tree, txGroup string, limitMHz int) snapshot {
	t.Helper()
	var ss []snapshot
	start, m0 := time.Now(), livelab.SampleMachine()
	// rate over the second that ends at snapshot j.
	rate := func(j int) (float64, int, bool) {
		i := j
		for i > 0 && ss[j].m.At.Sub(ss[i].m.At) < time.Second {
			i--
		}
		el := ss[j].m.At.Sub(ss[i].m.At).Seconds()
		if el < 0.9 {
			return 0, 0, false
		}
		return float64(ss[j].bytes-ss[i].bytes) * 8 / el, i, true
	}
	var seen []string
	for {
		ss = append(ss, f.snap(t, tree, txGroup))
		j := len(ss) - 1
		if now, i, ok := rate(j); ok {
			if before, h, ok := rate(i); ok {
				seen = append(seen, fmt.Sprintf("%.1f", now/1e6))
				if now > 0 && math.Abs(now-before) <= steadyTol*now {
					return ss[h]
				}
			}
		}
		if time.Since(start) > steadyWithin {
			t.Fatalf("limit %d MHz: the flow did not settle within %v (Mbps over the last second, every 250 ms: %s); %s; %s",
				limitMHz, steadyWithin, strings.Join(seen, " "), livelab.SampleMachine().Since(m0), f.diagnose())
		}
		time.Sleep(250 * time.Millisecond) // sampling the receiver's counters
	}
}

// waitListening polls ss in namespace ns until addr (IP:PORT) listens, for
// at most 5 s.
func waitListening(t *testing.T, ns, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := lab.Exec(context.Background(), ns, "ss", "-Hltn", "src", addr)
		if err == nil && strings.Contains(string(out), addr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s in %s after 5 s (ss: %q, %v)", addr, ns, out, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEstablished polls ss in namespace ns until n connections to addr
// (the server's IP:PORT) are established, for at most 30 s.
func waitEstablished(t *testing.T, ns, addr string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := lab.Exec(context.Background(), ns, "ss", "-Htn", "state", "established", "src", addr)
		if err == nil && strings.Count(string(out), addr) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's iperf3 client did not connect to %s in %s within 30 s (ss: %q, %v)", addr, ns, out, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// spearman is the rank correlation of x and y (no ties expected).
func spearman(x, y []float64) float64 {
	rank := func(v []float64) []float64 {
		r := make([]float64, len(v))
		for i := range v {
			for j := range v {
				if v[j] < v[i] {
					r[i]++
				}
			}
		}
		return r
	}
	// Pearson's r of the ranks: the sign of the slope, the root of R².
	s, _, r2 := sim.FitLine(rank(x), rank(y))
	return math.Copysign(math.Sqrt(r2), s)
}

// writeCalibration writes the simulator's scenario of the lab's sweep
// with the CPU model cal fitted to this run (the points pts): the
// simulator's calibration to this machine. Its expectations are the run's
// rates (±15%). scripts/calibrate-cpu.sh copies it to
// scenarios/calibration/cpu-limit-sweep-lab.yaml.
func writeCalibration(path string, cal calibration, pts []sim.SweepPoint, coreMHz int) error {
	host, _ := os.Hostname()
	when := time.Now().UTC().Format("2006-01-02 15:04 UTC")
	var b strings.Builder
	fmt.Fprintf(&b, `name: cpu-limit-sweep-lab
description: >
  Seed 003's sweep as the lab runs it live (livetest/cpulive
  TestSeed003Live): a QEMU TCG guest with 1 vCPU sends iperf3 (%d streams)
  to a VM on the same host, a machine of 2 cores at %d MHz, while its CPU
  limit steps from unlimited to 15%% of a core. The CPU model (cycles per
  byte, overhead, peak clock) is calibrated to the live run on %s, %s,
  written by the test and made the simulator's calibration by
  scripts/calibrate-cpu.sh; the expectations are that run's rates.
seed: 1
duration: 6s
sample: 1s
scheduler: default
policy:
  cluster: cpulab
  hosts:
    - name: h1
      cpu: {cores: 2, mhz: %d}
      memory: 24GiB
      uplinks: [{name: bridge, speed: 100Gbps}]
  vms:
    - {name: tx, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0}]}
    - {name: rx, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0}]}
models:
  net: {baseRTT: 20us}
  # %.0f MHz per Gbps above %.0f MHz; the unlimited guest used %.1f%% of a core.
  cpu: {cyclesPerByte: %.2f, overheadMHz: %.0f, peakMHz: %.0f}
workloads:
  - {name: iperf, type: bulk, port: tx/nic0, streams: %d, window: 256KiB}
runs:
`, sweepStreams, coreMHz, host, when, coreMHz, cal.mhzPerGbps, cal.OverheadMHz, pts[0].UsedPct, cal.CyclesPerByte, cal.OverheadMHz, cal.PeakMHz, sweepStreams)
	run := func(p sim.SweepPoint) string {
		if p.LimitMHz == 0 {
			return "unlimited"
		}
		return fmt.Sprintf("mhz%d", p.LimitMHz)
	}
	for _, p := range pts {
		if p.LimitMHz == 0 {
			b.WriteString("  - {name: unlimited}\n")
			continue
		}
		fmt.Fprintf(&b, "  - {name: %s, events: [{at: 0s, set: tx, cpuLimit: %dMHz}]}\n", run(p), p.LimitMHz)
	}
	b.WriteString(`plots:
  - {name: sweep, kind: expectations, title: "Seed 003 in the lab: throughput vs CPU limit, calibration run vs simulator", ylabel: Mbps, scale: 1e-6}
expect:
`)
	for _, p := range pts {
		name := "unlimited"
		if p.LimitMHz > 0 {
			name = fmt.Sprintf("limit %d MHz", p.LimitMHz)
		}
		fmt.Fprintf(&b, "  - {name: %q, run: %s, metric: rate, of: tx/nic0, from: 1s, to: 6s, value: %.2fMbps, tol: 15%%, seed: \"calibration run\"}\n", name, run(p), 1000*p.Gbps)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeSweep writes the points, the plot beside the seed's and a report
// section under the module's out/live/ (scripts/reproduce.sh adds the
// section to out/report.md when it is there).
func writeSweep(t *testing.T, root string, pts, simPts []sim.SweepPoint, r2, liveSlope, simSlope, busy float64, coreMHz int) {
	t.Helper()
	host, _ := os.Hostname()
	base := filepath.Join(root, sweepOut)
	when := time.Now().UTC().Format("2006-01-02 15:04 UTC")
	comments := []string{
		fmt.Sprintf("seed 003 live: TestSeed003Live (livetest/cpulive) on %s, %s, a core of %d MHz", host, when, coreMHz),
		fmt.Sprintf("a QEMU TCG guest (1 vCPU) sends iperf3 -P %d (client in the guest, one flow) to a namespace VM on its host; the agent sets its cgroup's cfs quota; from unlimited down to 15%% and back up, each limit counted twice for %d s (the flow's two steady seconds within %.0f%% and %d more), unlimited %d s at each end; rate from the receiver's sockets", sweepStreams, 2+sweepHalfS, 100*steadyTol, sweepHalfS, 2+sweepMeasureS),
		fmt.Sprintf("R² %.4f over the limited points; CPU-bound points %.3f Mbps per %% of a core, the simulator calibrated to this run %.3f", r2, 1000*liveSlope, 1000*simSlope),
	}
	if err := sim.WriteSweepCSV(base+".csv", comments, pts); err != nil {
		t.Errorf("write %s.csv: %v", base, err)
		return
	}
	if err := sim.PlotSweeps(base, "Seed 003: throughput vs CPU allocation, seed and live",
		sim.SweepCurve{Label: "seed 003 (ESX, 2.6 GHz, VMXNET3)", Points: sim.Seed003},
		sim.SweepCurve{Label: "live: QEMU TCG guest, cfs quota set by the agent", Points: pts},
		sim.SweepCurve{Label: "simulator calibrated to this run", Points: simPts}); err != nil {
		t.Errorf("plot: %v", err)
	}
	simAt := map[int]float64{}
	for _, p := range simPts {
		simAt[p.LimitMHz] = p.Gbps
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## cpu-limit-sweep, live: seed 003 on a real QEMU guest\n\n")
	fmt.Fprintf(&b, "TestSeed003Live (livetest/cpulive) on %s, %s: a QEMU TCG guest (1 vCPU) under libvirt sends iperf3 (the client in the guest, %d streams, one flow for the whole sweep) to a namespace VM on the same host; "+
		"the agent (`sluice agent --cpu`, in the test's process) sets the cfs quota of the guest's cgroup from the policy's `cpu.limitMHz`, "+
		"stepped from unlimited down to 15%% of a %d MHz core (this machine's, /proc/cpuinfo) and back up; each limit counted twice, %d s once the flow was steady (its two steady seconds within %.0f%% included), and averaged; the rate from the receiver's sockets (ss bytes_received) timed by the host. "+
		"The simulator's column is the simulator with its CPU model calibrated to this run (out/live/cpu-limit-sweep-lab.yaml; scripts/calibrate-cpu.sh makes it the simulator's calibration). "+
		"Ready is the run-queue wait of the QEMU threads (/proc/TID/schedstat) per wall time, summed over threads as esxtop's %%RDY.\n\n",
		host, when, sweepStreams, coreMHz, 2+sweepHalfS, 100*steadyTol)
	b.WriteString("| CPU limit | allocation (% of a core) | live (Mbps) | simulator (Mbps) | CPU used (%) | ready (%) | throttled (%) |\n|---|---|---|---|---|---|---|\n")
	for _, p := range pts {
		l := fmt.Sprintf("%d MHz", p.LimitMHz)
		if p.LimitMHz == 0 {
			l = "unlimited"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", l, p.AllocPct, 1000*p.Gbps, 1000*simAt[p.LimitMHz], p.UsedPct, p.ReadyPct, p.ThrottledPct)
	}
	ss, _, sr2 := sim.FitSweep(sim.Seed003)
	verdict := "✅ within 15%"
	if math.Abs(simSlope/liveSlope-1) > 0.15 {
		verdict = "❌ not within 15%"
	}
	fmt.Fprintf(&b, "\nLinear: R² %.4f over the limited points (the seed's own points: %.4f). Slope of the CPU-bound points: live %.3f Mbps per %% of a core, "+
		"the simulator calibrated to this run %.3f (%+.1f%%: %s). Relative to the throughput at 100%% of a core, the seed loses %.2f%% per %% of a core taken away, the live guest %.2f%%. "+
		"The rest of the machine (the receiver and other work) used %.0f%% of a core on average meanwhile.\n\n",
		r2, sr2, 1000*liveSlope, 1000*simSlope, 100*(simSlope/liveSlope-1), verdict, 100*ss/19.2, 100*liveSlope/pts[1].Gbps, 100*busy)
	b.WriteString("![Seed 003: throughput vs CPU allocation, seed and live](live/cpu-limit-sweep.png)\n\n")
	if err := os.WriteFile(base+".md", []byte(b.String()), 0o644); err != nil {
		t.Errorf("write %s.md: %v", base, err)
		return
	}
	t.Logf("points, plot and report section written to %s.{csv,png,svg,md}", base)
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("no go.mod above the test's directory")
		}
		d = up
	}
}

func tail(s string) string {
	if len(s) > 400 {
		return "…" + s[len(s)-400:]
	}
	return s
}

// requireSweep fails the test when the machine cannot run it.
func requireSweep(t *testing.T) cpuctl.Tree {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("TestSeed003Live needs root (namespaces, cgroups, libvirt)")
	}
	for _, tool := range []string{"iperf3", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("TestSeed003Live needs %s", tool)
		}
	}
	tree, err := cpuctl.Detect("")
	if err != nil {
		t.Fatal(err)
	}
	return tree
}
