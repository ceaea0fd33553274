package netlive

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"sluice/agent"
)

// A flow meant to fill its share of a link must keep packets waiting in
// its HTB class: then the scheduler, not the sender, decides its rate.
// When the machine starves a sender of CPU (this is a shared 2-vCPU VM
// whose host takes CPUs away), its queue runs dry, HTB lends the idle
// share to the other classes (every ceiling is the line rate), and the
// measured split says nothing about the scheduler. A class that had
// packets waiting in at least MinBacklogged of the samples after warm-up
// counts as backlogged; in unloaded runs every class had packets waiting
// in every sample.
const MinBacklogged = 0.97

// queueSampleEvery is how often the classes' queues are read.
const queueSampleEvery = 20 * time.Millisecond

// maxTries is how many times a run whose senders fell short is measured.
const maxTries = 3

// watchQueues samples, from fromS to toS seconds from now, whether the HTB
// class of each port on host's first uplink has packets waiting. The
// returned function waits for the window to end and returns, per port,
// the share of samples in which its class had packets waiting.
func (l *liveLab) watchQueues(host string, ports []string, fromS, toS int) func() map[string]float64 {
	t := l.t
	t.Helper()
	trees, err := agent.Build(l.p, l.plan, host)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[agent.Handle]string{}
	for _, n := range trees[0].Nodes {
		for _, p := range ports {
			if n.Name == p {
				ids[n.ID] = p
			}
		}
	}
	if len(ids) != len(ports) {
		t.Fatalf("watch queues: ports %v not all on %s's first uplink", ports, host)
	}
	k, err := agent.NewNetlinkKernel(l.plan.Host(host).Name)
	if err != nil {
		t.Fatal(err)
	}
	busy := map[string]int{}
	samples := 0
	var readErr error
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		defer k.Close()
		tick := time.NewTicker(queueSampleEvery)
		defer tick.Stop()
		for now := range tick.C {
			el := now.Sub(start)
			if el < time.Duration(fromS)*time.Second {
				continue
			}
			if el >= time.Duration(toS)*time.Second {
				return
			}
			cs, err := k.Classes(trees[0].Dev)
			if err != nil {
				readErr = err
				return
			}
			samples++
			for _, c := range cs {
				if p, ok := ids[c.ID]; ok && c.Queued > 0 {
					busy[p]++
				}
			}
		}
	}()
	return func() map[string]float64 {
		<-done
		if readErr != nil {
			t.Fatalf("watch queues: %v", readErr)
		}
		if samples == 0 {
			t.Fatal("watch queues: no samples")
		}
		out := map[string]float64{}
		for _, p := range ports {
			out[p] = float64(busy[p]) / float64(samples)
		}
		return out
	}
}

// runSaturating runs flows from host's VMs that each ask for more than
// their share (all of them together fill the uplink) for durS seconds and
// returns their rates, judged from second fromS on (see judged).
func (l *liveLab) runSaturating(host string, durS, fromS int, flows ...flow) []result {
	l.t.Helper()
	var ports []string
	for _, f := range flows {
		ports = append(ports, f.Name)
	}
	return l.judged(host, ports, fromS, durS-1, func() []result { return l.runFlows(durS, flows...) })
}

// judged runs a measurement whose ports (on host's first uplink) all ask
// for more than they get, and samples their classes' queues from fromS to
// toS seconds after it starts. When a sender left its queue empty too
// often (in more than 1−MinBacklogged of the samples), the run is logged
// and measured again, up to maxTries runs; then the test fails naming the
// sender. So a run is only judged when every sender kept up, and a
// scheduler that holds a backlogged flow under its share cannot pass.
func (l *liveLab) judged(host string, ports []string, fromS, toS int, run func() []result) []result {
	t := l.t
	t.Helper()
	for try := 1; ; try++ {
		wait := l.watchQueues(host, ports, fromS, toS)
		res := run()
		backlogged := wait()
		var short []string
		for _, p := range ports {
			if backlogged[p] < MinBacklogged {
				short = append(short, fmt.Sprintf("%s %.1f%%", p, 100*backlogged[p]))
			}
		}
		if len(short) == 0 {
			t.Logf("every sender kept packets waiting in its class (%s)", backloggedLine(backlogged))
			return res
		}
		var b strings.Builder
		for _, r := range res {
			fmt.Fprintf(&b, "\n  %s per second: %s", r.Name, r.series())
		}
		msg := fmt.Sprintf("senders short of CPU: classes with packets waiting in fewer than %.0f%% of the samples: %s (all: %s)%s",
			100*MinBacklogged, strings.Join(short, ", "), backloggedLine(backlogged), b.String())
		if try == maxTries {
			t.Fatalf("%d runs in a row, the machine could not drive the lab: %s", maxTries, msg)
		}
		t.Logf("run %d not judged: %s; measuring again", try, msg)
	}
}

func backloggedLine(m map[string]float64) string {
	var parts []string
	for p, v := range m {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", p, 100*v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
