package ctllive

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// requireLive fails the test when the machine cannot run the lab.
func requireLive(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the live DRS test needs root (network namespaces, tc); run as root")
	}
	for _, tool := range []string{"ip", "tc", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the live DRS test needs %s (scripts/deps.sh installs it)", tool)
		}
	}
}

// guestTCP is the VMs' congestion control (as livetest/netlive: CUBIC,
// set per connection).
const guestTCP = "cubic"

// receiverWatch is livelab's watch of the receivers in the fabric (the
// iperf3 servers on the ports' iperf3 ports: tcp_info's bytes_received,
// counted by the kernel when the bytes arrive), by port name.
type receiverWatch struct {
	*livelab.Receivers
	port map[string]int
}

func watchReceivers(t *testing.T, plan *lab.Plan, ports []string) *receiverWatch {
	t.Helper()
	w := &receiverWatch{Receivers: livelab.WatchReceivers(t, plan, livelab.ServerSide), port: map[string]int{}}
	for _, p := range ports {
		w.port[p] = plan.NIC(p).IperfPort
	}
	return w
}

// rate is port's received payload rate in bits/s over [a, b], from the
// samples nearest to a and b (ok false when the samples do not cover the
// window or a flow restarted).
func (w *receiverWatch) rate(port string, a, b time.Time) (float64, bool) {
	return w.Rate(w.port[port], a, b)
}

func (w *receiverWatch) err() error { return w.Err() }

func (w *receiverWatch) stop() { _ = w.Stop() }

// startFlows runs one iperf3 client per port (one stream, CUBIC) from
// the port's VM to its server in the fabric for durS seconds; the
// returned functions stop them (also called at cleanup) and wait for
// them to end.
func startFlows(t *testing.T, plan *lab.Plan, ports []string, durS int) (stop, wait func()) {
	t.Helper()
	var cmds []*exec.Cmd
	for _, port := range ports {
		vm, _, _ := strings.Cut(port, "/")
		cmd := exec.Command("ip", "netns", "exec", plan.VM(vm).Name, "iperf3", "-c", lab.FabricIP.String(),
			"-p", strconv.Itoa(plan.NIC(port).IperfPort), "-t", strconv.Itoa(durS), "-C", guestTCP)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	var once sync.Once
	end := func(kill bool) {
		once.Do(func() {
			for _, c := range cmds {
				if kill {
					_ = c.Process.Kill()
				}
				_ = c.Wait()
			}
		})
	}
	t.Cleanup(func() { end(true) })
	return func() { end(true) }, func() { end(false) }
}

// minCarried: a second is judged when every class of the host watched had
// packets waiting in ≥ 95% of the samples (livelab.Backlogged: the
// scheduler, not a CPU-starved sender, set the rates) and the host's flows together
// carried ≥ 97% of the usable rate (the machine let HTB fill the link):
// livetest/netlive's rules (queues_test.go); and the receiver samples at
// its ends were timed precisely (livelab.Receivers.Window).
const minCarried = livelab.MinCarried

// hostWatch is a class watch of one host's ports (livelab.Watch) with
// its start, so that its seconds line up with the receiver samples.
type hostWatch struct {
	p       *policy.Policy
	host    string
	ports   []string
	start   time.Time
	stop    func() []livelab.Second
	machine *livelab.MachineWatch // the machine's load, per second
}

func watchHost(t *testing.T, p *policy.Policy, host string, ports []string, machine *livelab.MachineWatch) *hostWatch {
	t.Helper()
	plan, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	w := livelab.Watch(t, plan, p, host, ports)
	return &hostWatch{p: p, host: host, ports: ports, start: w.Start(), stop: w.Stop, machine: machine}
}

// judgedSecond is one judged second of a host watch with each port's rate.
type judgedSecond struct {
	At    time.Time
	Rates map[string]float64
}

// judge returns the seconds of the watch from `from` on (up to now) with
// their rates, whether each counts (judged), and the work conservation of
// those seconds (livelab.Conserved: every class backlogged and the ends
// timed, against what the flows carried). A thin second in which some
// the machine was busy (livelab.Load.Busy) is the machine's, as
// livelab.Judge rules: it does not count against the scheduler, and its
// mark says what the machine did.
func (hw *hostWatch) judge(secs []livelab.Second, rw *receiverWatch, from time.Time, usable float64) (judged []judgedSecond, all []string, c livelab.Conservation) {
	var backlogged []bool
	var sums []float64
	for i := range secs {
		a := hw.start.Add(time.Duration(i) * time.Second)
		if a.Before(from) || i == len(secs)-1 { // the last second may be partial
			continue
		}
		rates := map[string]float64{}
		tw := rw.Window(a, a.Add(time.Second))
		timed, sum := tw.OK(), 0.0
		ok := livelab.Backlogged(secs, i, hw.ports) && timed
		if timed && tw.From.Before(a) {
			ok = ok && livelab.Backlogged(secs, i-1, hw.ports)
		}
		if timed && tw.To.After(a.Add(time.Second)) {
			ok = ok && livelab.Backlogged(secs, i+1, hw.ports)
		}
		for _, p := range hw.ports {
			r := 0.0
			if timed {
				r = rw.Between(rw.port[p], tw)
			} else {
				r, _ = rw.rate(p, a, a.Add(time.Second))
			}
			rates[p] = r
			sum += r
		}
		busy := ""
		if ok && sum < minCarried*usable {
			if l := hw.machine.Between(tw.From, tw.To); l.Busy() {
				ok = false
				busy = fmt.Sprintf(" busy: CPU wait %.0f%%, steal %.2f", 100*max(l.WaitShare, 0), l.StealCores)
			}
		}
		backlogged, sums = append(backlogged, ok), append(sums, sum)
		ok = ok && sum >= minCarried*usable
		var parts []string
		for _, p := range hw.ports {
			parts = append(parts, fmt.Sprintf("%.0f", rates[p]/1e6))
		}
		mark := strings.Join(parts, "/") + busy
		if !timed {
			mark = "untimed" // the receiver samples at its ends were late or slow
		}
		if !ok {
			mark = "(" + mark + ")"
		} else {
			judged = append(judged, judgedSecond{At: a, Rates: rates})
		}
		all = append(all, mark)
	}
	return judged, all, livelab.Conserved(backlogged, sums, usable)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func mbps(v float64) string { return fmt.Sprintf("%.1f", v/1e6) }

func relErr(got, want float64) float64 {
	if want == 0 {
		return 1
	}
	return (got - want) / want
}

// measureUsable runs the ports' flows on host together for 10 s under a
// static tree (an agent in this process on policy p) and returns the
// upper quartile of their summed rates in the judged seconds from 3 s on
// (livetest/netlive's measureUsable: the machine only ever takes capacity
// away). Only seconds in which every class stayed backlogged and the flows
// carried ≥ 97% of what full segments carry on the line count; up to
// three runs.
func measureUsable(t *testing.T, p *policy.Policy, host string, ports []string) float64 {
	t.Helper()
	plan, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	_, stopAgent := livelab.RunAgent(t, plan, p, host, false)
	defer stopAgent()
	maxBps := policyMaxPayload(p, host)
	m0 := livelab.SampleMachine()
	mw := livelab.WatchMachine(t)
	for try := 1; try <= 3; try++ {
		rw := watchReceivers(t, plan, ports)
		hw := watchHost(t, p, host, ports, mw)
		_, wait := startFlows(t, plan, ports, 10)
		t0 := time.Now()
		wait()
		secs := hw.stop()
		rw.stop()
		if err := rw.err(); err != nil {
			t.Fatalf("receiver watch: %v", err)
		}
		judged, all, _ := hw.judge(secs, rw, t0.Add(3*time.Second), maxBps)
		var sums []float64
		for _, s := range judged {
			sum := 0.0
			for _, r := range s.Rates {
				sum += r
			}
			sums = append(sums, sum)
		}
		sort.Float64s(sums)
		if len(sums) >= 3 {
			u := sums[len(sums)*3/4]
			t.Logf("usable rate of %s's uplink (%s together, static tree): %.1f Mbps (upper quartile of the judged seconds' sums; per second, Mbps per port, not judged in parentheses: %s)",
				host, strings.Join(ports, ", "), u/1e6, strings.Join(all, " "))
			return u
		}
		t.Logf("usable-rate run %d: only %d judged seconds (%s); %s; measuring again", try, len(sums), strings.Join(all, " "), rw.Reads(t0, time.Now()))
	}
	t.Fatalf("three usable-rate runs in a row without 3 judged seconds: the machine could not drive the lab (%s)", livelab.SampleMachine().Since(m0))
	return 0
}

// policyMaxPayload is what full TCP segments carry on host's first uplink.
func policyMaxPayload(p *policy.Policy, host string) float64 {
	return agent.MaxPayloadBps(p.Host(host).Uplinks[0].Speed)
}

// withHosts returns a copy of p whose VMs run where hosts says.
func withHosts(p *policy.Policy, hosts map[string]string) *policy.Policy {
	q := *p
	q.VMs = append([]policy.VM(nil), p.VMs...)
	for i := range q.VMs {
		if h, ok := hosts[q.VMs[i].Name]; ok {
			q.VMs[i].Host = h
		}
	}
	return &q
}

var errTimeout = errors.New("timed out")

// poll calls cond every 100 ms until it is true or d passed.
func poll(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errTimeout
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
