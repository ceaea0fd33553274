// Package netlive holds the live network tests: real iperf3 traffic between
// network namespaces of a sluice lab, shaped by the agent's HTB trees. They
// need root, network namespaces, tc (HTB, u32), iperf3 and sockperf, and
// fail (not skip) when those are missing. Every test removes its lab with
// lab.Down in t.Cleanup, also when it fails.
package netlive

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/agent"
	"sluice/entitle"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
)

// requireLive fails the test when the machine cannot run the lab.
func requireLive(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("live network tests need root (network namespaces, tc); run as root")
	}
	for _, tool := range []string{"ip", "tc", "iperf3", "sockperf", "nbdkit", "ss"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("live network tests need %s (scripts/deps.sh installs it)", tool)
		}
	}
	if out, err := exec.Command("modprobe", "-n", "sch_htb").CombinedOutput(); err != nil {
		if _, serr := os.Stat("/sys/module/sch_htb"); serr != nil {
			t.Logf("sch_htb module check: %s", strings.TrimSpace(string(out)))
		}
	}
}

// liveLab is a lab brought up for one test.
type liveLab struct {
	t        *testing.T
	p        *policy.Policy
	plan     *lab.Plan
	stateDir string
	file     string
	ipv6     map[string]bool // ports whose VM sends over IPv6 only
	// in says the judged runs are of what the VMs receive (inbound).
	in bool
}

// inbound returns the lab as judged runs of inbound flows see it: the
// classes of the uplink's inbound tree (on its IFB) and the receivers in
// the VMs.
func (l *liveLab) inbound() *liveLab {
	c := *l
	c.in = true
	return &c
}

// upLab writes the policy text, brings its lab up and registers its removal.
func upLab(t *testing.T, yaml string) *liveLab {
	t.Helper()
	requireLive(t)
	dir := t.TempDir()
	file := dir + "/policy.yaml"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	_ = lab.Down(p.Cluster, dir) // a leftover from a crashed run
	t.Cleanup(func() {
		if err := lab.Down(p.Cluster, dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := lab.Existing(p.Cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces behind: %v", left)
		}
	})
	if _, err := lab.Up(p, lab.Options{StateDir: dir, PolicyFile: file}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	return &liveLab{t: t, p: p, plan: pl, stateDir: dir, file: file}
}

// runAgent starts the agent of host in this process (dynamic or static)
// for policy p (the lab's when nil) and returns a function that stops it
// (also called at cleanup). It returns after the first step installed the
// tree.
func (l *liveLab) runAgent(p *policy.Policy, host string, dynamic bool) (*agent.Agent, func()) {
	l.t.Helper()
	if p == nil {
		p = l.p
	}
	return livelab.RunAgent(l.t, l.plan, p, host, dynamic)
}

// installAgent makes a dynamic agent of host for the lab's policy, with
// the state file record and the roots directory roots, and runs its
// first step (the caller steps it further and closes the kernel).
func (l *liveLab) installAgent(host, record, roots string) (*agent.Agent, *agent.NetlinkKernel) {
	l.t.Helper()
	k, err := agent.NewNetlinkKernel(l.plan.Host(host).Name)
	if err != nil {
		l.t.Fatal(err)
	}
	inv, err := l.plan.Inventory(host)
	if err != nil {
		l.t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Policy: l.p, Host: host, Kernel: k, Inventory: inv, Dynamic: true, RecordPath: record, RootsDir: roots})
	if err != nil {
		l.t.Fatal(err)
	}
	if _, err := a.Step(agent.NowNs()); err != nil {
		l.t.Fatal(err)
	}
	return a, k
}

// withUsable returns a copy of the lab's policy whose uplinks have the
// measured usable rate.
func (l *liveLab) withUsable(usable float64) *policy.Policy { return livelab.WithUsable(l.p, usable) }

// measureUsable runs the ports' flows together for a few seconds under a
// static tree and returns the upper quartile of their summed per-second
// payload rates after warm-up: the uplink's usable rate for the test that
// sends those flows. It is measured with the same flows because on this
// shared machine what the HTB root passes depends on how many senders feed
// it (one sender alone measured 1–5% below three, 2026-11-24); the upper
// quartile because the machine only ever takes capacity away. Only seconds
// in which every sender kept its class backlogged and the flows carried
// at least MinCarried of what full TCP segments can carry on the line
// (agent.MaxPayloadBps: 956.4 Mbps at 1 Gbps) count (judged): a whole run
// that the host slowed read 926 where the runs after it carried 933–946.
//
// Every lab of this package has the same topology (namespaces, veths, a
// bridge per host, one uplink to the fabric), so a measurement holds for
// every test that sends as many flows, in the same direction and address
// family, through an uplink of the same speed: the first such test
// measures it and the later ones of the run take it (usableOf).
func (l *liveLab) measureUsable(host string, ports ...string) float64 {
	speed := l.p.Host(host).Uplinks[0].Speed
	v6 := 0
	for _, p := range ports {
		if l.ipv6[p] {
			v6++
		}
	}
	key := fmt.Sprintf("%s uplink of %s, %d flows (%d over IPv6), inbound %v", policy.FormatRate(speed), host, len(ports), v6, l.in)
	usableMu.Lock()
	defer usableMu.Unlock()
	if u, ok := usableOf[key]; ok {
		l.t.Logf("usable rate of %s's uplink: %s Mbps, measured by %s earlier in this run (%s)", host, mbps(u.bps), u.by, key)
		return u.bps
	}
	u := l.measureUsableNow(host, speed, ports)
	usableOf[key] = measuredUsable{bps: u, by: l.t.Name()}
	return u
}

// usableOf holds the usable rates measured in this run, by what the flows
// were (measureUsable).
var (
	usableMu sync.Mutex
	usableOf = map[string]measuredUsable{}
)

type measuredUsable struct {
	bps float64
	by  string // the test that measured it
}

func (l *liveLab) measureUsableNow(host string, speed policy.Bps, ports []string) float64 {
	_, stop := l.runAgent(nil, host, false)
	defer stop()
	var fl []flow
	for _, p := range ports {
		fl = append(fl, l.nicFlow(p, 1))
	}
	const durS, fromS = 8, 3
	maxBps := agent.MaxPayloadBps(speed)
	res := l.judged(host, ports, maxBps, judgedAtLeast(3, fromS), func(time.Time) []result { return l.runFlows(durS, fl...) })
	sums := judgedSums(res, fromS)
	sort.Float64s(sums)
	// A second's sum above what the line can carry is bytes the receivers
	// counted across a second's end (seen: 990 beside 956 956 956 at
	// 1 Gbps): the usable rate is at most the line's.
	u := min(sums[len(sums)*3/4], maxBps)
	l.t.Logf("usable rate of %s's uplink (%s together, static tree, 1 Gbps HTB root): %s Mbps (upper quartile of the judged seconds %s, at most what full segments can carry, %s)",
		host, strings.Join(ports, ", "), mbps(u), mbpsList(sums), mbps(maxBps))
	return u
}

// judgedSums are the flows' summed rates in the judged seconds from `from`
// on.
func judgedSums(res []result, from int) []float64 {
	var sums []float64
	for i := from; ; i++ {
		s := 0.0
		for _, r := range res {
			if i >= len(r.Intervals) {
				return sums
			}
			s += r.Intervals[i]
		}
		if len(res) > 0 && (i >= len(res[0].Short) || !res[0].Short[i]) {
			sums = append(sums, s)
		}
	}
}

// medianSum is the median over the judged seconds from `from` on of the
// flows' summed rates.
func medianSum(res []result, from int) float64 { return median(judgedSums(res, from)) }

func mbpsList(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.0f", x/1e6))
	}
	return strings.Join(parts, " ")
}

// GuestTCP is the congestion control of the VMs' TCP senders: CUBIC, the
// default of Linux guests, set per connection (iperf3 -C) so that the lab
// does not inherit the machine's default; with BBR one second in ten moved
// by 10–50% (docs/lab.md, docs/perf/network.md).
const GuestTCP = "cubic"

// flow is one iperf3 client run.
type flow struct {
	Name    string // port name or label
	NS      string // namespace of the client
	Port    int    // server port in the fabric
	Streams int
	DelayS  int    // start after this many seconds
	Reverse bool   // iperf3 -R: the fabric's server sends, the client in NS receives
	TOS     int    // IP TOS byte (DSCP<<2), 0 for none
	Bind    string // source address, "" for any
	Dst     string // server address, "" for lab.FabricIP
}

// result is the receiver's per-second rates of one flow, in bits/s.
type result struct {
	Name      string
	Port      int       // the iperf3 port of its server
	StartS    int       // the flow's delay: its first interval is this second of the run
	Intervals []float64 // receiver side, one per second (judged: what the receiver's socket received in that second of the run)
	// Short marks the seconds that judged did not judge (a sender left its
	// class's queue empty, the second's ends were not timed, or the link
	// was not full; nil when nobody watched): those seconds say nothing
	// about the scheduler and the medians skip them.
	Short []bool
	// Late marks the seconds whose count TCP displaced (livelab.Judgement
	// Late), and Sent is each second's payload rate by its class's counters
	// (livelab.Judgement Sent): see secondRate.
	Late []bool
	Sent []float64
}

// judgedFrom returns the intervals from second `from` on that are not
// Short.
func (r result) judgedFrom(from int) []float64 {
	var out []float64
	for i := from; i < len(r.Intervals); i++ {
		if i >= len(r.Short) || !r.Short[i] {
			out = append(out, r.Intervals[i])
		}
	}
	return out
}

// mean of the intervals in [from, to) seconds (to ≤ 0: to the end).
func (r result) mean(from, to int) float64 {
	if to <= 0 || to > len(r.Intervals) {
		to = len(r.Intervals)
	}
	if from >= to {
		return 0
	}
	s := 0.0
	for _, v := range r.Intervals[from:to] {
		s += v
	}
	return s / float64(to-from)
}

// runFlows runs the flows at once for durS seconds (each from its delay on)
// and returns the receiver-side per-second rates.
func (l *liveLab) runFlows(durS int, flows ...flow) []result {
	t := l.t
	t.Helper()
	out := make([]result, len(flows))
	errs := make([]error, len(flows))
	var wg sync.WaitGroup
	for i, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f.DelayS > 0 {
				time.Sleep(time.Duration(f.DelayS) * time.Second) // a traffic schedule, not synchronization
			}
			dst := f.Dst
			if dst == "" {
				dst = lab.FabricIP.String()
			}
			args := []string{"iperf3", "-c", dst, "-p", strconv.Itoa(f.Port), "-t", strconv.Itoa(durS - f.DelayS),
				"-J", "--get-server-output", "-C", GuestTCP}
			if f.Streams > 1 {
				args = append(args, "-P", strconv.Itoa(f.Streams))
			}
			if f.TOS > 0 {
				args = append(args, "-S", strconv.Itoa(f.TOS))
			}
			if f.Bind != "" {
				args = append(args, "-B", f.Bind)
			}
			if f.Reverse {
				args = append(args, "-R")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(durS+30)*time.Second)
			defer cancel()
			var b []byte
			var err error
			for try := 0; try < 3; try++ { // the server may still be busy with a previous client
				b, err = lab.Exec(ctx, f.NS, args...)
				if err == nil || !strings.Contains(string(b)+err.Error(), "busy") {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %v %s", f.Name, err, tail(string(b)))
				return
			}
			r, err := parseIperf(b, f.Reverse)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %v", f.Name, err)
				return
			}
			r.Name, r.Port, r.StartS = f.Name, f.Port, f.DelayS
			out[i] = r
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// backgroundFlows starts flows' iperf3 clients, for at most durS seconds,
// as traffic for a test that reads the rates elsewhere (their own
// results are not kept); stop ends them, waits, and fails the test if one
// ended with an error before it was stopped.
func (l *liveLab) backgroundFlows(durS int, flows ...flow) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, len(flows))
	var wg sync.WaitGroup
	for i, f := range flows {
		dst := f.Dst
		if dst == "" {
			dst = lab.FabricIP.String()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := lab.Exec(ctx, f.NS, "iperf3", "-c", dst, "-p", strconv.Itoa(f.Port), "-t", strconv.Itoa(durS), "-C", GuestTCP)
			if ctx.Err() == nil {
				errs[i] = err
			}
		}()
	}
	return func() {
		l.t.Helper()
		cancel()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				l.t.Errorf("%s's flow ended before it was stopped: %v", flows[i].Name, err)
			}
		}
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return s[len(s)-300:]
	}
	return s
}

// iperfIntervals are the per-second intervals of one end of an iperf3 -J
// run.
type iperfIntervals struct {
	Intervals []struct {
		Sum struct {
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum"`
	} `json:"intervals"`
}

// parseIperf reads the receiver's per-second intervals from iperf3 -J
// --get-server-output: the server's, or with reverse (-R: the client
// receives) the client's own.
func parseIperf(b []byte, reverse bool) (result, error) {
	var j struct {
		Error string `json:"error"`
		iperfIntervals
		ServerJSON *iperfIntervals `json:"server_output_json"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return result{}, fmt.Errorf("iperf3 output: %v", err)
	}
	if j.Error != "" {
		return result{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	recv := j.ServerJSON
	if reverse {
		recv = &j.iperfIntervals
	}
	if recv == nil {
		return result{}, fmt.Errorf("iperf3: no server output")
	}
	var r result
	for _, iv := range recv.Intervals {
		if iv.Sum.Seconds >= 0.5 { // drop a trailing partial interval
			r.Intervals = append(r.Intervals, iv.Sum.BitsPerSecond)
		}
	}
	return r, nil
}

// nicFlow is the iperf3 flow of a vNIC to its server in the fabric.
func (l *liveLab) nicFlow(port string, streams int) flow {
	n := l.plan.NIC(port)
	if n == nil {
		l.t.Fatalf("no vNIC %s", port)
	}
	vm := strings.SplitN(port, "/", 2)[0]
	f := flow{Name: port, NS: l.plan.VM(vm).Name, Port: n.IperfPort, Streams: streams, Reverse: l.in}
	if l.ipv6[port] {
		f.Dst = lab.FabricIP6.String()
	}
	return f
}

// onlyIPv6 takes the IPv4 address off the vNIC's device in its VM: the VM
// then sends IPv6 only (nicFlow goes to the fabric's IPv6 address).
func (l *liveLab) onlyIPv6(port string) {
	n := l.plan.NIC(port)
	vm := strings.SplitN(port, "/", 2)[0]
	if out, err := exec.Command("ip", "-n", l.plan.VM(vm).Name, "-4", "addr", "flush", "dev", n.Dev).CombinedOutput(); err != nil {
		l.t.Fatalf("removing %s's IPv4 address: %v %s", port, err, out)
	}
	if l.ipv6 == nil {
		l.ipv6 = map[string]bool{}
	}
	l.ipv6[port] = true
}

// startServer runs an extra iperf3 server in the fabric (for host-level
// flows); lab.Down kills it with everything else in the namespace.
func (l *liveLab) startServer(port int) {
	t := l.t
	cmd := exec.Command("ip", "netns", "exec", l.plan.Fabric.Name, "iperf3", "-s", "-J", "-B", lab.FabricIP.String(), "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "exec", l.plan.Fabric.Name, "ss", "-Hltn").Output()
		if strings.Contains(string(out), ":"+strconv.Itoa(port)+" ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 server on %d did not start", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mbps(v float64) string { return fmt.Sprintf("%.1f", v/1e6) }

func relErr(got, want float64) float64 {
	if want == 0 {
		return math.Inf(1)
	}
	return (got - want) / want
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// statsLine summarizes the agent's vNIC statistics: measured wire rate,
// entitlement and HTB rate in Mbps.
func statsLine(a *agent.Agent) string {
	var b strings.Builder
	for _, u := range a.Stats().Uplinks {
		for _, p := range u.Ports {
			if strings.Contains(p.Port, "/nic") || p.RateBps > 1e6 {
				fmt.Fprintf(&b, "%s rate %s ent %s htb %s; ", p.Port, mbps(p.RateBps), mbps(p.EntitlementBps), mbps(float64(p.GuaranteeBps)))
			}
		}
	}
	return b.String()
}

// series renders the per-second rates in Mbps, a Short second in
// parentheses.
func (r result) series() string {
	var parts []string
	for i, v := range r.Intervals {
		if i < len(r.Short) && r.Short[i] {
			parts = append(parts, fmt.Sprintf("(%.0f)", v/1e6))
			continue
		}
		parts = append(parts, fmt.Sprintf("%.0f", v/1e6))
	}
	return strings.Join(parts, " ")
}

// warmupS is how many seconds of each run are left out of the means: TCP
// ramps up and dynamic enforcement converges (its demand window is 1 s).
const warmupS = 4

// median of the judged intervals from second `from` on: robust to a
// second that the shared machine disturbed although every sender kept up.
func (r result) median(from int) float64 {
	return median(r.judgedFrom(from))
}

// steadyTol is how close each port's rate must be over two consecutive
// seconds for the flows to be steady (waitSteady).
const steadyTol = 0.05

// waitSteady reads, every 100 ms, the bytes that each port's HTB class on
// host's first uplink has sent, and returns when the last two whole
// seconds each port sent within steadyTol of the same rate (the flows and
// the agent converged: the scheduler's output, not a schedule of seconds
// fixed in advance). After `within` it returns an error that says what the
// classes did and what the machine did meanwhile.
func (l *liveLab) waitSteady(host string, ports []string, within time.Duration) (time.Time, error) {
	l.t.Helper()
	dev, err := l.uplinkDev(host)
	if err != nil {
		l.t.Fatal(err)
	}
	inv, err := l.plan.Inventory(host)
	if err != nil {
		l.t.Fatal(err)
	}
	trees, err := agent.Build(entitle.Derive(l.p, entitle.Live{}).HostUplinks(host), inv)
	if err != nil {
		l.t.Fatal(err)
	}
	ids := map[agent.Handle]string{}
	for _, n := range trees[0].Nodes {
		for _, p := range ports {
			if n.Name == p {
				ids[n.ID] = p
			}
		}
	}
	k, err := agent.NewNetlinkKernel(l.plan.Host(host).Name)
	if err != nil {
		l.t.Fatal(err)
	}
	defer k.Close()
	type sample struct {
		at    time.Time
		bytes map[string]float64
	}
	var samples []sample
	start := livelab.SampleMachine()
	// rate is each port's rate over the second that ends at sample j.
	rate := func(j int) (map[string]float64, bool) {
		i := j
		for i > 0 && samples[j].at.Sub(samples[i].at) < time.Second {
			i--
		}
		el := samples[j].at.Sub(samples[i].at).Seconds()
		if el < 0.9 || el > 1.5 {
			return nil, false
		}
		out := map[string]float64{}
		for _, p := range ports {
			out[p] = 8 * (samples[j].bytes[p] - samples[i].bytes[p]) / el
		}
		return out, true
	}
	last := ""
	deadline := time.Now().Add(within)
	for {
		cs, err := k.Classes(dev)
		if err != nil {
			l.t.Fatal(err)
		}
		s := sample{at: time.Now(), bytes: map[string]float64{}}
		for _, c := range cs {
			if p, ok := ids[c.ID]; ok {
				s.bytes[p] = float64(c.Bytes)
			}
		}
		samples = append(samples, s)
		j := len(samples) - 1
		// The second before the last one ends where the last one begins.
		if now, ok := rate(j); ok {
			k := j
			for k > 0 && samples[j].at.Sub(samples[k].at) < time.Second {
				k--
			}
			if before, ok := rate(k); ok {
				steady := true
				var parts []string
				for _, p := range ports {
					steady = steady && now[p] > 0 && math.Abs(now[p]-before[p]) <= steadyTol*now[p]
					parts = append(parts, fmt.Sprintf("%s %s → %s", p, mbps(before[p]), mbps(now[p])))
				}
				if steady {
					return s.at, nil
				}
				last = strings.Join(parts, ", ") + " Mbps"
			}
		}
		if s.at.After(deadline) {
			return time.Time{}, fmt.Errorf("the flows were not steady (two seconds within %.0f%%) within %v: last %s; %s", 100*steadyTol, within, last, livelab.SampleMachine().Since(start))
		}
		time.Sleep(100 * time.Millisecond) // sampling the classes' counters
	}
}

// secondRate is the rate a check of single seconds judges at second i
// (from on), and what it covers: the second's own; when TCP displaced
// bytes between it and a neighbour (both marked Late) and both are
// judged, the pair's mean, logged, with ok false for the pair's second;
// when the neighbour lies outside the judged seconds (before from, or
// after the run's end, where the receiver's count of what the class sent
// is not measured), what its class sent (Sent, payload), logged.
func (r result) secondRate(t *testing.T, i, from int) (got float64, what string, ok bool) {
	late := func(k int) bool { return k >= 0 && k < len(r.Late) && r.Late[k] }
	pair := func(a, b int) (float64, string, bool) {
		what := fmt.Sprintf("seconds %d–%d (%s and %s Mbps, bytes held across their boundary)", a, b, mbps(r.Intervals[a]), mbps(r.Intervals[b]))
		got := (r.Intervals[a] + r.Intervals[b]) / 2
		t.Logf("%s %s: judged by their mean %s Mbps", r.Name, what, mbps(got))
		return got, what, true
	}
	switch {
	case !late(i):
		return r.Intervals[i], fmt.Sprintf("second %d", i), true
	case late(i-1) && i-1 >= from:
		return 0, "", false // judged with second i-1
	case late(i+1) && i+1 < len(r.Intervals):
		return pair(i, i+1)
	case i < len(r.Sent) && r.Sent[i] > 0:
		what = fmt.Sprintf("second %d (its receiver counted %s Mbps, bytes held across the edge of the judged seconds)", i, mbps(r.Intervals[i]))
		t.Logf("%s %s: judged by what its class sent, %s Mbps of payload", r.Name, what, mbps(r.Sent[i]))
		return r.Sent[i], what, true
	}
	return r.Intervals[i], fmt.Sprintf("second %d", i), true
}
