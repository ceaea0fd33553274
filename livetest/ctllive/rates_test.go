package ctllive

import (
	"context"
	"errors"
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

// hostWatch is a class watch of one host's ports (livelab.Watch) with
// the machine's watch, so that its seconds are judged by livelab.Judge.
type hostWatch struct {
	p       *policy.Policy
	host    string
	ports   []string
	cw      *livelab.ClassWatch
	machine *livelab.MachineWatch // the machine's load, per second
}

func watchHost(t *testing.T, p *policy.Policy, host string, ports []string, machine *livelab.MachineWatch) *hostWatch {
	t.Helper()
	plan, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	return &hostWatch{p: p, host: host, ports: ports, cw: livelab.Watch(t, plan, p, host, ports), machine: machine}
}

// judgedSecond is one judged second of a host watch with each port's rate.
type judgedSecond struct {
	At    time.Time
	Rates map[string]float64
}

// judge stops the watch and judges its whole seconds from `from` on with
// livelab.Judge, the flows (running before the watch began) counted from
// there: the judged seconds with their rates, a mark per second (the
// ports' Mbps, in parentheses when not judged), and the Judgement (its
// work conservation and, in Summary, why seconds were set aside).
func (hw *hostWatch) judge(rw *receiverWatch, from time.Time, usable float64) (judged []judgedSecond, all []string, j livelab.Judgement) {
	secs, start := hw.cw.Stop(), hw.cw.Start()
	first := max(int(math.Ceil(from.Sub(start).Seconds())), 0)
	n := len(secs) - 1 - first // the watch's last second may be partial
	if n <= 0 {
		return nil, nil, livelab.Judgement{}
	}
	var flows []livelab.Flow
	for _, p := range hw.ports {
		flows = append(flows, livelab.Flow{Name: p, Port: rw.port[p], StartS: first, N: n, Running: true})
	}
	j = livelab.Judge(hw.cw, rw.Receivers, flows, hw.ports, usable, hw.machine)
	for k := range n {
		i := first + k
		rates, parts := map[string]float64{}, []string{}
		for _, p := range hw.ports {
			rates[p] = j.Rates[p][k]
			parts = append(parts, fmt.Sprintf("%.0f", rates[p]/1e6))
		}
		mark := strings.Join(parts, "/")
		if j.Short[i] {
			mark = "(" + mark + ")"
		} else {
			judged = append(judged, judgedSecond{At: start.Add(time.Duration(i) * time.Second), Rates: rates})
		}
		all = append(all, mark)
	}
	return judged, all, j
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
		hw.cw.Stop()
		rw.stop()
		if err := rw.err(); err != nil {
			t.Fatalf("receiver watch: %v", err)
		}
		judged, all, jm := hw.judge(rw, t0.Add(3*time.Second), maxBps)
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
		t.Logf("usable-rate run %d: only %d judged seconds (%s); %s; measuring again", try, len(sums), strings.Join(all, " "), jm.Summary())
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
