package virtlive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/agent"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
)

// labPolicy is Fig. 2 step a at 1/4 scale with real guests: three QEMU
// guests on one host whose uplink is 200 Mbps (three TCG guests share the
// machine's 2 vCPUs; together they can drive a few hundred Mbps, and vm1
// must keep its class backlogged at about 164 Mbps: at 250 Mbps it could
// not in a slow make test run, 2026-11-27), equal shares, vm1 reserving
// 150 Mbps (75%, as 750 of 1000 in the seed).
const labPolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 200Mbps}]
trafficClasses:
  vm: {shares: normal, reservation: 150Mbps}
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, nics: [{name: nic0, shares: normal, reservation: 150Mbps}]}
  - {name: vm2, host: h1, lab: {kind: qemu}, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: h1, lab: {kind: qemu}, nics: [{name: nic0, shares: normal}]}
`

// ipv6Guest is the guest that gets no IPv4 address: it sends IPv6 only.
// It is vm1, the one that reserves, so that the IPv6 guest is held to a
// reservation (step a) and to a limit (next to an IPv4 guest).
const ipv6Guest = "vm1"

// guestLab is a lab of real guests brought up for one test.
type guestLab struct {
	t        *testing.T
	p        *policy.Policy
	plan     *lab.Plan
	stateDir string
}

// TestLabGuests brings up a lab whose three VMs are QEMU guests under the
// real libvirtd (`lab: {kind: qemu}`), checks what `lab status` and the
// inventory say of them, and then:
//
//   - Fig. 2 step a: with the uplink's usable rate measured first (static
//     tree, the three guests sending together), the agent in dynamic mode
//     holds each guest's received rate within 5% of alloc's entitlement
//     (median of the judged seconds, judged as livetest/netlive does:
//     every class backlogged, no receiver behind, the link full; see
//     checkSplit);
//   - IPv6: vm1 has no IPv4 address, so step a holds an IPv6-only guest to
//     its reservation; then limited to 60 Mbps next to vm2 (IPv4, also
//     60 Mbps), both stay within 5% of the limit.
//
// `lab down` then leaves no domain, tap or namespace of the cluster.
func TestLabGuests(t *testing.T) {
	l := upGuestLab(t)
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	l.checkGuestExec()
	l.checkGuestSockperf()

	usable := l.measureUsable(ports)
	p := l.withUsable(usable)
	func() {
		_, stop := l.runAgent(p, true)
		defer stop()
		res := l.judged(ports, usable, dynamicS, dynamicWarmupS, func() []result { return l.runFlows(dynamicS, ports...) })
		for _, v := range checkSplit(t, p, res, ports, dynamicWarmupS) {
			t.Error(v)
		}
	}()

	// Limits: vm1 (IPv6 only, its reservation dropped) and vm2 (IPv4),
	// 60 Mbps each, together.
	q := *p
	q.VMs = append([]policy.VM(nil), p.VMs...)
	for i := range q.VMs {
		if q.VMs[i].Name == "vm1" || q.VMs[i].Name == "vm2" {
			q.VMs[i].NICs = append([]policy.NIC(nil), q.VMs[i].NICs...)
			q.VMs[i].NICs[0].Reservation, q.VMs[i].NICs[0].Limit = 0, 60e6
		}
	}
	_, stop := l.runAgent(&q, true)
	defer stop()
	for _, r := range l.runFlows(8, "vm1/nic0", "vm2/nic0") {
		got := r.mean(warmupS)
		fam := "IPv4"
		if strings.HasPrefix(r.Name, ipv6Guest+"/") {
			fam = "IPv6 only"
		}
		t.Logf("%s (%s) limited to 60 Mbps: mean %s Mbps, per second %s", r.Name, fam, mbps(got), r.series())
		if math.Abs(relErr(got, 60e6)) > 0.05 {
			t.Errorf("%s (%s): mean %s Mbps, want 57–63 (its 60 Mbps limit ±5%%)", r.Name, fam, mbps(got))
		}
	}
}

// checkSplit compares each port's median rate over the judged seconds
// from fromS with its entitlement of the capacity the link carried (the
// median of the judged seconds' sums: the semantics applied to the
// capacity that was there, which differs from the usable rate measured
// before by about 1%), and returns one message per port outside it:
//
//   - below: more than 5% under its entitlement;
//   - above: more than 5% over it plus its part of what the others
//     received below their entitlements. What a class does not take,
//     its neighbours may (work conservation): a guest's sender leaves
//     its class empty for moments too short for the 20-ms samples to
//     see, and a 1% sag of the guest entitled to 164 Mbps is +6% for
//     each 14-Mbps guest. The others' shortfall goes to the n-1 others
//     equally (equal shares here). A scheduler that gives a guest more
//     than that takes it from someone, who then falls more than 5% below.
func checkSplit(t *testing.T, p *policy.Policy, res []result, ports []string, fromS int) []string {
	sums := judgedSums(res, fromS)
	sort.Float64s(sums)
	if len(sums) == 0 {
		return []string{"no judged second"}
	}
	carried := sums[len(sums)/2]
	want := livelab.Entitlements(p, "h1", carried, append([]string{"h1/vm"}, ports...)...)
	short := map[string]float64{}
	for _, r := range res {
		short[r.Name] = max(0, want[r.Name]-r.median(fromS))
	}
	var bad []string
	for _, r := range res {
		got, w := r.median(fromS), want[r.Name]
		lent := 0.0
		for _, o := range res {
			if o.Name != r.Name {
				lent += short[o.Name] / float64(len(res)-1)
			}
		}
		e := relErr(got, w)
		msg := fmt.Sprintf("%s per second (Mbps): %s; median %s, entitled %s of the %s carried (%+.1f%%); its part of the others' shortfall %s",
			r.Name, r.series(), mbps(got), mbps(w), mbps(carried), 100*e, mbps(lent))
		switch {
		case e < -0.05:
			bad = append(bad, msg+": more than 5% below its entitlement")
		case got > 1.05*w+lent:
			bad = append(bad, fmt.Sprintf("%s: above its entitlement +5%% plus that (%s Mbps)", msg, mbps(1.05*w+lent)))
		}
		t.Logf("dynamic %s", msg)
	}
	return bad
}

// checkGuestExec runs commands inside vm1 through the guest agent: its
// output and exit status come back, and the host's fio runs in the guest.
func (l *guestLab) checkGuestExec() {
	t := l.t
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := lab.GuestExec(ctx, l.p.Cluster, "vm1", "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
	if err == nil || res.Exit != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("guest exec: got exit %d, stdout %q, stderr %q, err %v; want 3, \"out\\n\", \"err\\n\" and an error", res.Exit, res.Stdout, res.Stderr, err)
	}
	res, err = lab.GuestExec(ctx, l.p.Cluster, "vm1", "fio", "--name=g", "--filename=/tmp/fio.dat", "--size=4M",
		"--rw=randwrite", "--bs=4k", "--io_size=1M", "--output-format=json")
	if err != nil {
		t.Fatalf("fio in the guest: %v", err)
	}
	var out struct {
		Jobs []struct {
			Write struct {
				IOs int64 `json:"total_ios"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(res.Stdout, &out); err != nil || len(out.Jobs) != 1 || out.Jobs[0].Write.IOs != 256 {
		t.Fatalf("fio in the guest: want 256 writes of 4 KiB in its JSON, got %+v (%v); output %s", out, err, res.Stdout)
	}
}

// checkGuestSockperf runs the host's sockperf in vm2 as a TCP ping-pong
// client against the lab's sockperf server in the fabric namespace
// (lab.SockperfPort), across the guest's tap, its host's bridge and
// uplink: it must report a latency from its observations.
func (l *guestLab) checkGuestSockperf() {
	t := l.t
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := lab.GuestExec(ctx, l.p.Cluster, "vm2", "sockperf", "ping-pong", "--tcp", "-i", lab.FabricIP.String(),
		"-p", strconv.Itoa(lab.SockperfPort), "-t", "5", "--no-rdtsc")
	out := string(res.Stdout) + string(res.Stderr)
	if err != nil {
		t.Fatalf("sockperf in the guest: %v\n%s", err, tailOf(out))
	}
	lat, obs := sockperfSummary(out)
	t.Logf("sockperf ping-pong (TCP) from guest vm2 to the fabric: latency %.1f µs (half the round trip) over %d observations", lat, obs)
	if !(lat > 0) || obs == 0 {
		t.Fatalf("sockperf in the guest reported no latency: %s", tailOf(out))
	}
}

// sockperfSummary reads sockperf's "Summary: Latency is X usec" and
// "Total N observations".
func sockperfSummary(out string) (usec float64, observations int) {
	for _, line := range strings.Split(out, "\n") {
		if _, rest, ok := strings.Cut(line, "Summary: Latency is "); ok {
			usec, _ = strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " usec"), 64)
		}
		if _, rest, ok := strings.Cut(line, "Total "); ok && strings.Contains(rest, " observations") {
			if n, err := strconv.Atoi(strings.Fields(rest)[0]); err == nil {
				observations = n
			}
		}
	}
	return usec, observations
}

// upGuestLab brings the lab of labPolicy up with a fresh cluster name and
// registers its removal (also when the test fails); guests power
// themselves off after 5 minutes in any case.
func upGuestLab(t *testing.T) *guestLab {
	t.Helper()
	preflight(t)
	for _, tool := range []string{"iperf3", "sockperf", "nbdkit", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
	cluster := "vg" + randHex(2)
	dir, err := os.MkdirTemp("", "sl-"+cluster+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(labPolicy, cluster)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Down(p.Cluster, dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := lab.Existing(p.Cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces: %v", left)
		}
		if left, err := lab.ExistingDomains(p.Cluster); err != nil || len(left) > 0 {
			t.Errorf("lab down left domains: %v (%v)", left, err)
		}
		for _, v := range pl.VMs {
			for _, n := range v.NICs {
				if _, err := os.Stat("/sys/class/net/" + n.Tap); err == nil {
					t.Errorf("lab down left tap %s in the root namespace", n.Tap)
				}
			}
		}
	})
	t0 := time.Now()
	if _, err := lab.Up(p, lab.Options{StateDir: dir, PolicyFile: file, GuestTTL: 5 * time.Minute,
		GuestIPv6Only: map[string]bool{ipv6Guest: true}}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Logf("lab up with %d guests in %v", len(pl.VMs), time.Since(t0).Round(100*time.Millisecond))
	for _, v := range pl.VMs {
		t.Logf("%s: %s", v.VM, lastLine(filepath.Join(dir, "lab-"+p.Cluster+"-guest-"+v.VM+".log"), "sl-guest: ready"))
	}

	st, err := lab.GetStatus(p.Cluster, dir)
	if err != nil {
		t.Fatal(err)
	}
	guests := 0
	for _, ns := range st.Namespaces {
		if ns.Kind == policy.LabQemu {
			guests++
			if !ns.Exists || ns.Role != lab.RoleVM {
				t.Errorf("status: guest %+v, want role vm, running", ns)
			}
		}
	}
	if guests != 3 || !st.Up {
		t.Errorf("status lists %d running guests (up %v), want 3", guests, st.Up)
	}
	inv, err := pl.Inventory("h1")
	if err != nil {
		t.Fatal(err)
	}
	host := pl.Host("h1").Name
	for port, m := range inv.VNICs {
		n := pl.NIC(port)
		out, err := lab.Exec(context.Background(), host, "cat", "/sys/class/net/"+m.HostDev+"/tun_flags")
		master, _ := lab.Exec(context.Background(), host, "readlink", "/sys/class/net/"+m.HostDev+"/master")
		if err != nil || filepath.Base(strings.TrimSpace(string(master))) != n.Bridge {
			t.Errorf("%s: HostDev %s in %s: tun_flags %q (%v), master %q, want a tap on %s", port, m.HostDev, host, out, err, master, n.Bridge)
		}
	}
	return &guestLab{t: t, p: p, plan: pl, stateDir: dir}
}

// runAgent starts the agent of h1 in this process for p with the lab's
// inventory; it returns after the first step installed the tree.
func (l *guestLab) runAgent(p *policy.Policy, dynamic bool) (*agent.Agent, func()) {
	l.t.Helper()
	return livelab.RunAgent(l.t, l.plan, p, "h1", dynamic)
}

// withUsable returns a copy of the policy whose uplinks have the measured
// usable rate.
func (l *guestLab) withUsable(usable float64) *policy.Policy { return livelab.WithUsable(l.p, usable) }

// measureUsable: the ports' flows together for 10 s under a static tree;
// the upper quartile of their summed rates in the judged seconds (the
// link full by MinCarried of what full segments carry at line rate).
func (l *guestLab) measureUsable(ports []string) float64 {
	_, stop := l.runAgent(l.p, false)
	defer stop()
	maxBps := agent.MaxPayloadBps(l.p.Host("h1").Uplinks[0].Speed)
	res := l.judged(ports, maxBps, 10, 3, func() []result { return l.runFlows(10, ports...) })
	sums := judgedSums(res, 3)
	sort.Float64s(sums)
	u := sums[len(sums)*3/4]
	l.t.Logf("usable rate (three guests together, static tree, 200 Mbps HTB root): %s Mbps (upper quartile of the judged seconds %s; full segments could carry %s)",
		mbps(u), mbpsList(sums), mbps(maxBps))
	return u
}

// guestDst is the address the fabric's client reaches a port's guest at.
func (l *guestLab) guestDst(port string) string {
	n := l.plan.NIC(port)
	if strings.HasPrefix(port, ipv6Guest+"/") {
		return n.IP6.String()
	}
	return n.IP.String()
}

// GuestTCP is the congestion control of the guests' senders (CUBIC, as in
// livetest/netlive; the guest's kernel applies it on iperf3's request).
const GuestTCP = "cubic"

// result is the receiver's per-second rates of one flow, in bits/s, and
// the seconds that were not judged.
type result struct {
	Name      string
	Intervals []float64
	Short     []bool
}

// runFlows has each port's guest send for durS seconds: the iperf3 client
// in the fabric asks the guest's server to send (-R) and counts what it
// receives.
func (l *guestLab) runFlows(durS int, ports ...string) []result {
	t := l.t
	t.Helper()
	out := make([]result, len(ports))
	errs := make([]error, len(ports))
	var wg sync.WaitGroup
	for i, port := range ports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"iperf3", "-c", l.guestDst(port), "-p", strconv.Itoa(l.plan.NIC(port).IperfPort), "-R",
				"-t", strconv.Itoa(durS), "-J", "-C", GuestTCP}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(durS+30)*time.Second)
			defer cancel()
			var b []byte
			var err error
			for try := 0; ; try++ {
				b, err = lab.Exec(ctx, l.plan.Fabric.Name, args...)
				var j struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(b, &j)
				if err == nil && j.Error != "" {
					err = errors.New(j.Error)
				}
				// After a test the guest's server listens again a moment
				// later (refused), or is still busy with the last client.
				if err == nil || try == 10 || !retryable(err) {
					break
				}
				time.Sleep(300 * time.Millisecond)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %v %s", port, err, tailOf(string(b)))
				return
			}
			var j struct {
				Intervals []struct {
					Sum struct {
						Seconds       float64 `json:"seconds"`
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum"`
				} `json:"intervals"`
			}
			if err := json.Unmarshal(b, &j); err != nil {
				errs[i] = fmt.Errorf("%s: iperf3 output: %v", port, err)
				return
			}
			r := result{Name: port}
			for _, iv := range j.Intervals {
				if iv.Sum.Seconds >= 0.5 {
					r.Intervals = append(r.Intervals, iv.Sum.BitsPerSecond)
				}
			}
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

func tailOf(s string) string {
	if len(s) > 300 {
		return s[len(s)-300:]
	}
	return s
}

// The judgement of seconds is livetest/netlive's (livelab.Judge): a
// second counts when every port's HTB class had packets waiting in ≥
// MinBacklogged of the 20-ms samples of each second its measured window
// touches, both ends of the window were timed (the receivers' kernel
// counters, read within livelab.MaxSpan), and the flows together carried ≥
// MinCarried of the usable rate. A run with fewer than half its seconds
// after warm-up judged is measured again, up to maxTries times, with the
// machine's evidence: the machine (2 vCPUs shared by three TCG guests,
// the agent and the receivers) was short of CPU. Seconds with every class
// backlogged and the link thin are the scheduler's: under
// livelab.MinWorkConserved of them full, the test fails at once.
const (
	MinBacklogged    = livelab.MinBacklogged
	MinCarried       = livelab.MinCarried
	queueSampleEvery = livelab.SampleEvery
	maxTries         = 3
	warmupS          = 4
	// The dynamic run is longer and its first seconds are left out
	// longer than in livetest/netlive: with three TCG guests on 2 vCPUs
	// the agent converged 4–6 s after the flows started (2026-11-24).
	dynamicS       = 14
	dynamicWarmupS = 6
)

type second = livelab.Second

// judged runs a saturating measurement of durS seconds and marks its
// unjudged seconds (see above); it measures again when fewer than half the
// seconds after warm-up count. The rates are what the receivers in the
// fabric (the clients of the guests' iperf3 servers) received in each
// second of the run.
func (l *guestLab) judged(ports []string, usable float64, durS, fromS int, run func() []result) []result {
	t := l.t
	t.Helper()
	for try := 1; ; try++ {
		mw := livelab.WatchMachine(t)
		cw := livelab.Watch(t, l.plan, l.p, "h1", ports)
		rw := livelab.WatchReceivers(t, l.plan, livelab.ClientSide)
		res := run()
		secs := cw.Stop()
		if err := rw.Stop(); err != nil {
			t.Fatalf("receivers: %v", err)
		}
		var flows []livelab.Flow
		for _, r := range res {
			flows = append(flows, livelab.Flow{Name: r.Name, Port: l.plan.NIC(r.Name).IperfPort, N: len(r.Intervals)})
		}
		j := livelab.Judge(cw, rw, flows, ports, usable, mw)
		mw.Stop()
		judged := 0
		for i := fromS; i < len(j.Short); i++ {
			if !j.Short[i] {
				judged++
			}
		}
		for i := range res {
			res[i].Intervals, res[i].Short = j.Rates[res[i].Name], j.Short
		}
		var b strings.Builder
		for _, r := range res {
			busy, all := 0, 0
			for _, sec := range secs[:min(len(j.Short), len(secs))] {
				busy += sec.Busy[r.Name]
				all += sec.Samples
			}
			fmt.Fprintf(&b, "\n  %s per second: %s (packets waiting in %.0f%% of the samples)", r.Name, r.series(), 100*float64(busy)/float64(max(all, 1)))
		}
		why := fmt.Sprintf("%d of %d seconds judged after %d s warm-up; %s", judged, len(j.Short)-fromS, fromS, j.Summary())
		// Backlogged classes that leave the link idle are the scheduler's
		// fault, not the machine's: they fail at once, not measured again.
		if v := j.Conservation.Verdict(usable); v != "" {
			t.Fatalf("%s; %s:%s", v, why, b.String())
		}
		if judged >= (durS-fromS+1)/2 {
			t.Logf("%s", why)
			return res
		}
		if try == maxTries {
			t.Fatalf("%d runs in a row, the machine could not drive three guests: %s (in parentheses the seconds not judged):%s", maxTries, why, b.String())
		}
		t.Logf("run %d: %s; measuring again:%s", try, why, b.String())
	}
}

func judgedSums(res []result, from int) []float64 {
	var sums []float64
	for i := from; len(res) > 0 && i < len(res[0].Intervals); i++ {
		if res[0].Short[i] {
			continue
		}
		s := 0.0
		for _, r := range res {
			if i < len(r.Intervals) {
				s += r.Intervals[i]
			}
		}
		sums = append(sums, s)
	}
	return sums
}

func (r result) median(from int) float64 {
	var v []float64
	for i := from; i < len(r.Intervals); i++ {
		if i >= len(r.Short) || !r.Short[i] {
			v = append(v, r.Intervals[i])
		}
	}
	sort.Float64s(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

func (r result) mean(from int) float64 {
	if from >= len(r.Intervals) {
		return 0
	}
	s := 0.0
	for _, v := range r.Intervals[from:] {
		s += v
	}
	return s / float64(len(r.Intervals)-from)
}

func (r result) series() string {
	var parts []string
	for i, v := range r.Intervals {
		if i < len(r.Short) && r.Short[i] {
			parts = append(parts, fmt.Sprintf("(%.0f)", v/1e6))
		} else {
			parts = append(parts, fmt.Sprintf("%.0f", v/1e6))
		}
	}
	return strings.Join(parts, " ")
}

func mbps(v float64) string { return fmt.Sprintf("%.1f", v/1e6) }

func mbpsList(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.0f", x/1e6))
	}
	return strings.Join(parts, " ")
}

func relErr(got, want float64) float64 {
	if want == 0 {
		return math.Inf(1)
	}
	return (got - want) / want
}

// retryable tells an iperf3 error of a guest's server that is still
// finishing its last test (TCG guests take a moment to listen again):
// refused, busy, or the control connection reset.
func retryable(err error) bool {
	for _, s := range []string{"refused", "busy", "reset by peer"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}
