package netlive

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/entitle"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
)

// TestAgentKilledLive: in a lab from `sluice lab up`, the agent binary
// (`sluice agent --host h1 --policy F`, dynamic) enforces Fig. 2 step a
// while three VMs send; once the flows are steady (the agent converged)
// and three seconds more have passed, it is killed with SIGKILL, and a new
// one started three seconds later. While no agent runs, its classes stay and enforce the
// last rates; the new agent's first step leaves every class in place (no
// class made again: byte counters keep counting) at the rate and ceiling
// it found; and the rates are within 5% of alloc's entitlements (medians
// of the judged seconds) before the kill, without an agent, and from 1 s
// after the restart on, every judged second from then on within 10% (two
// seconds whose counts TCP displaced, the judge's Late marks, by their
// mean).
func TestAgentKilledLive(t *testing.T) {
	requireLive(t)
	dir := t.TempDir()
	bin := livelab.MustSluiceBinary(t)
	l := upLabCLI(t, bin, strings.ReplaceAll(fig2Policy, "cluster: nf2", "cluster: nak"))
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	usable := l.measureUsable("h1", ports...)
	p := l.withUsable(usable)
	want := livelab.Entitlements(p, "h1", usable, append([]string{"h1/vm"}, ports...)...)
	rate := policy.FormatRate(policy.Bps(int64(usable/1e3) * 1e3))
	pfile := filepath.Join(dir, "policy-usable.yaml")
	text := strings.ReplaceAll(fig2Policy, "cluster: nf2", "cluster: nak")
	text = strings.ReplaceAll(text, "speed: 1Gbps}", "speed: 1Gbps, usable: "+rate+"}")
	if err := os.WriteFile(pfile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	stats := agent.StatsPath(dir, "nak", "h1")
	// startAgent starts the agent binary and returns it with a function
	// that kills it (also called at cleanup) once its first step is done,
	// and how long that took.
	startAgent := func() (*exec.Cmd, func(), time.Duration) {
		_ = os.Remove(stats)
		cmd := exec.Command(bin, "agent", "--host", "h1", "--policy", pfile, "--state-dir", dir)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		kill := func() { _ = cmd.Process.Kill(); <-done }
		t.Cleanup(kill)
		// The statistics file is written after the first step.
		for {
			if _, err := os.Stat(stats); err == nil {
				return cmd, kill, time.Since(start)
			}
			select {
			case <-done:
				t.Fatalf("sluice agent exited before its first step")
			default:
			}
			if time.Since(start) > 10*time.Second {
				t.Fatal("sluice agent wrote no statistics within 10 s")
			}
			time.Sleep(10 * time.Millisecond) // polling another process, with a deadline
		}
	}
	dev := l.plan.Host("h1").Name
	classes := func() map[agent.Handle]agent.ClassState {
		k, err := agent.NewNetlinkKernel(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		up, err := l.uplinkDev("h1")
		if err != nil {
			t.Fatal(err)
		}
		cs, err := k.Classes(up)
		if err != nil {
			t.Fatal(err)
		}
		m := map[agent.Handle]agent.ClassState{}
		for _, c := range cs {
			m[c.ID] = c
		}
		return m
	}

	// The kill comes by progress: once the flows are steady (waitSteady:
	// the agent converged) and phaseS judged-length seconds more have
	// passed; the new agent phaseS seconds after the kill. durS leaves
	// room for a slow convergence: steadyWithin, then the phases.
	const phaseS, steadyWithin = 4, 10 * time.Second
	const durS = int(steadyWithin/time.Second) + 2*phaseS + 8
	var before, after map[agent.Handle]agent.ClassState
	var firstStep time.Duration
	var steadyS, killedS, restartedS float64
	var steadyErr error
	// Interval i is second i of the run: sec(s) is the first that begins
	// at or after s seconds, upTo(s) the first that does not end by s.
	sec := func(s float64) int { return int(math.Ceil(s)) }
	upTo := func(s float64) int { return int(math.Floor(s)) }
	res := l.judged("h1", ports, usable, func(short []bool) bool {
		return steadyErr == nil &&
			countJudged(short[:max(0, min(upTo(killedS), len(short)))], sec(steadyS)) >= 1 &&
			countJudged(short[:max(0, min(upTo(restartedS), len(short)))], sec(killedS)) >= 1 &&
			countJudged(short, sec(restartedS)+1) >= 3
	}, func(t0 time.Time) []result {
		a, killA, _ := startAgent()
		defer killA() // a run measured again starts from no agent
		results := make(chan []result, 1)
		go func() {
			results <- l.runFlows(durS, l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1), l.nicFlow(ports[2], 1))
		}()
		var steady time.Time
		if steady, steadyErr = l.waitSteady("h1", ports, steadyWithin); steadyErr != nil {
			return <-results
		}
		steadyS = steady.Sub(t0).Seconds()
		time.Sleep(time.Until(steady.Add(phaseS * time.Second))) // the seconds judged before the kill
		_ = a.Process.Signal(syscall.SIGKILL)
		killedS = time.Since(t0).Seconds()
		time.Sleep(phaseS * time.Second) // the seconds judged without an agent
		before = classes()
		restartedS = time.Since(t0).Seconds()
		_, killB, step := startAgent()
		defer killB()
		firstStep = step
		after = classes()
		return <-results
	})
	if steadyErr != nil {
		t.Fatalf("the agent did not bring the flows to steady rates: %v", steadyErr)
	}
	t.Logf("the new agent's first step took %s (start to statistics written) at %.1f s of the run", firstStep.Round(time.Millisecond), restartedS)
	if firstStep > time.Second {
		t.Errorf("the new agent needed %s for its first step, want ≤ 1 s", firstStep.Round(time.Millisecond))
	}
	for id, b := range before {
		a, ok := after[id]
		switch {
		case !ok:
			t.Errorf("class %v gone after the new agent's first step", id)
		case a.Bytes < b.Bytes:
			t.Errorf("class %v made again by the new agent's first step (bytes %d → %d)", id, b.Bytes, a.Bytes)
		case math.Abs(relErr(float64(a.RateBps), float64(b.RateBps))) > 0.05 || a.CeilBps != b.CeilBps:
			t.Errorf("class %v: the new agent's first step moved rate %s → %s Mbps, ceil %s → %s Mbps (want what it found)",
				id, mbps(float64(b.RateBps)), mbps(float64(a.RateBps)), mbps(float64(b.CeilBps)), mbps(float64(a.CeilBps)))
		}
	}
	from := sec(restartedS) + 1 // 1 s after the restart
	for _, r := range res {
		t.Logf("%s per second (steady at %.1f s, killed at %.1f s, restarted at %.1f s): %s; entitled %s Mbps", r.Name, steadyS, killedS, restartedS, r.series(), mbps(want[r.Name]))
		part := func(lo, hi int) []float64 {
			var v []float64
			for i := lo; i < hi && i < len(r.Intervals); i++ {
				if !r.Short[i] {
					v = append(v, r.Intervals[i])
				}
			}
			return v
		}
		for _, ph := range []struct {
			name   string
			lo, hi int
		}{{"before the kill", sec(steadyS), upTo(killedS)}, {"without an agent", sec(killedS), upTo(restartedS)}, {"from 1 s after the restart", from, len(r.Intervals)}} {
			v := part(ph.lo, ph.hi)
			if len(v) == 0 {
				continue
			}
			if e := relErr(median(v), want[r.Name]); math.Abs(e) > 0.05 {
				t.Errorf("%s %s: median %s Mbps, entitled %s: %+.1f%% (want within 5%%)", r.Name, ph.name, mbps(median(v)), mbps(want[r.Name]), 100*e)
			}
		}
		for i := from; i < len(r.Intervals); i++ {
			got, what, ok := r.secondRate(t, i, from)
			if !ok {
				continue
			}
			if e := relErr(got, want[r.Name]); !r.Short[i] && math.Abs(e) > 0.10 {
				t.Errorf("%s %s (after the restart): %s Mbps, entitled %s: %+.1f%% (want within 10%%)", r.Name, what, mbps(got), mbps(want[r.Name]), 100*e)
			}
		}
	}
}

// upLabCLI brings the policy's lab up with `sluice lab up` (binary bin)
// and registers `sluice lab down` at cleanup, also after a failure.
func upLabCLI(t *testing.T, bin, yaml string) *liveLab {
	t.Helper()
	requireLive(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	state := filepath.Join(dir, "state")
	_ = exec.Command(bin, "lab", "down", file, "--state-dir", state).Run() // a leftover of a crashed run
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "lab", "down", file, "--state-dir", state).CombinedOutput(); err != nil {
			t.Errorf("sluice lab down: %v\n%s", err, out)
		}
		if left := lab.Existing(p.Cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces behind: %v", left)
		}
	})
	if out, err := exec.Command(bin, "lab", "up", file, "--state-dir", state).CombinedOutput(); err != nil {
		t.Fatalf("sluice lab up: %v\n%s", err, out)
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	return &liveLab{t: t, p: p, plan: pl, stateDir: state, file: file}
}

// uplinkDev is the device of host's first uplink in the agent's tree.
func (l *liveLab) uplinkDev(host string) (string, error) {
	inv, err := l.plan.Inventory(host)
	if err != nil {
		return "", err
	}
	trees, err := agent.Build(entitle.Derive(l.p, entitle.Live{}).HostUplinks(host), inv)
	if err != nil {
		return "", err
	}
	return trees[0].Dev, nil
}
