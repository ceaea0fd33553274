package netlive

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"sluice/livetest/livelab"
)

// A flow meant to fill its share of a link must keep packets waiting in
// its HTB class: then the scheduler, not the sender, decides its rate.
// When the machine starves a sender of CPU (this is a shared 2-vCPU VM
// whose host takes CPUs away, at times for many seconds), its queue runs
// dry, HTB lends the idle share to the other classes (every ceiling is
// the line rate), and the split measured in that second says nothing
// about the scheduler. A second counts (is judged) when every watched
// class had packets waiting in at least MinBacklogged of its samples; in
// unloaded runs every class had packets waiting in every sample.
const MinBacklogged = livelab.MinBacklogged

// queueSampleEvery is how often the classes' queues are read.
const queueSampleEvery = livelab.SampleEvery

// maxTries is how many times a run with too few judged seconds is measured.
const maxTries = 3

// judgedAtLeast returns a run requirement: at least n judged seconds from
// second `from` on.
func judgedAtLeast(n, from int) func(short []bool) bool {
	return func(short []bool) bool { return countJudged(short, from) >= n }
}

func countJudged(short []bool, from int) int {
	c := 0
	for i := from; i < len(short); i++ {
		if !short[i] {
			c++
		}
	}
	return c
}

// MinCarried is livelab's rule of a full link: all classes can borrow up
// to the line rate, so HTB keeps a link with backlogged classes full
// unless the machine delays its dequeue timers (runs on an unloaded
// machine carry 99–100% in every second; on 2026-11-24, with the host
// taking CPUs, single seconds fell to 90–95%).
const MinCarried = livelab.MinCarried

// runSaturating runs flows from host's VMs that each ask for more than
// their share (all of them together fill the uplink) for durS seconds and
// returns their rates, with at least half the seconds after fromS judged
// (see judged). With usable > 0 a second is also judged only if the flows
// together carried at least MinCarried of it.
func (l *liveLab) runSaturating(host string, durS, fromS int, usable float64, flows ...flow) []result {
	l.t.Helper()
	var ports []string
	for _, f := range flows {
		ports = append(ports, f.Name)
	}
	return l.judged(host, ports, usable, judgedAtLeast((durS-fromS+1)/2, fromS), func(time.Time) []result { return l.runFlows(durS, flows...) })
}

// judged runs a measurement (run, given when second 0 of the run began) whose ports (on host's first uplink) all ask
// for more than they get, watching their classes' queues (livelab.Watch)
// and the receivers' kernel counters (livelab.WatchReceivers), and judges
// its seconds (livelab.Judge): the rates are what the receivers' sockets
// received in each second of the run, and a second is judged when every
// sender kept its queue, both ends of the second were timed and, with
// usable > 0, the flows together carried at least MinCarried of it. When
// the run's judged seconds do not meet need, it is logged with the
// machine's evidence and measured again, up to maxTries runs; then the
// test fails saying why. So a second is only judged when every sender
// kept up and the machine let HTB fill the link, and a scheduler that
// holds a backlogged flow under its share cannot pass. The seconds in
// which the classes stayed backlogged but the link was not full are the
// scheduler's (unless tasks waited for a CPU more than
// livelab.MaxMachineWait of the second: the machine's, with that
// evidence): with usable > 0 their share is its work conservation
// (livelab.Conserved), and under livelab.MinWorkConserved the test fails
// at once, naming the scheduler, without measuring again.
func (l *liveLab) judged(host string, ports []string, usable float64, need func(short []bool) bool, run func(start time.Time) []result) []result {
	t := l.t
	t.Helper()
	for try := 1; ; try++ {
		mw := livelab.WatchMachine(t)
		cw, rw := l.watchers(host, ports)
		res := run(cw.Start())
		secs := cw.Stop()
		if err := rw.Stop(); err != nil {
			t.Fatalf("receivers: %v", err)
		}
		var flows []livelab.Flow
		for _, r := range res {
			flows = append(flows, livelab.Flow{Name: r.Name, Port: r.Port, StartS: r.StartS, N: len(r.Intervals)})
		}
		j := livelab.Judge(cw, rw, flows, ports, usable, mw)
		mw.Stop()
		for i := range res {
			res[i].Intervals, res[i].Late, res[i].Sent = j.Rates[res[i].Name], j.Late[res[i].Name], j.Sent[res[i].Name]
			if slices.Contains(ports, res[i].Name) {
				res[i].Short = j.Short[res[i].StartS:]
			}
		}
		if usable > 0 {
			// Work conservation is the scheduler's own figure: backlogged
			// classes that leave the link idle are its fault, not the
			// machine's, and are not measured again.
			c := j.Conservation
			t.Logf("work conservation: %d of %d backlogged seconds carried ≥%.0f%% of the usable %s Mbps (%.0f%%, floor %.0f%%)",
				c.Full, c.Backlogged, 100*MinCarried, mbps(usable), 100*c.Share(), 100*livelab.MinWorkConserved)
			if v := c.Verdict(usable); v != "" {
				var b strings.Builder
				for _, r := range res {
					fmt.Fprintf(&b, "\n  %s per second: %s", r.Name, r.series())
				}
				t.Fatalf("%s; %s; %s:%s", v, backlogSummary(secs, ports, len(j.Short)), j.Summary(), b.String())
			}
		}
		why := j.Summary() + "; " + backlogSummary(secs, ports, len(j.Short))
		if need(j.Short) {
			t.Logf("%s (a second counts when every class had packets waiting in ≥%.0f%% of its samples and its ends were timed)", why, 100*MinBacklogged)
			return res
		}
		var b strings.Builder
		for _, r := range res {
			fmt.Fprintf(&b, "\n  %s per second: %s", r.Name, r.series())
		}
		msg := fmt.Sprintf("too few seconds judged (%s); in parentheses the seconds not judged:%s", why, b.String())
		if try == maxTries {
			t.Fatalf("%d runs in a row with too few seconds judged: %s", maxTries, msg)
		}
		t.Logf("run %d: %s; measuring again", try, msg)
	}
}

// watchers starts the watches of a judged run: the classes of the ports
// on host's first uplink and the receivers in the fabric; for a lab of
// inbound flows (liveLab.inbound) the classes of the uplink's inbound tree
// and the receivers in the VMs.
func (l *liveLab) watchers(host string, ports []string) (*livelab.ClassWatch, *livelab.Receivers) {
	if !l.in {
		return livelab.Watch(l.t, l.plan, l.p, host, ports), livelab.WatchReceivers(l.t, l.plan, livelab.ServerSide)
	}
	var vms []string
	for _, p := range ports {
		vm, _, _ := strings.Cut(p, "/")
		vms = append(vms, vm)
	}
	return livelab.WatchInbound(l.t, l.plan, l.p, host, ports), livelab.WatchVMReceivers(l.t, l.plan, vms)
}

// backlogSummary names, per port, the share of samples of the run's n
// seconds in which its class had packets waiting.
func backlogSummary(secs []livelab.Second, ports []string, n int) string {
	var parts []string
	for _, p := range ports {
		busy, all := 0, 0
		for _, sec := range secs[:min(n, len(secs))] {
			all += sec.Samples
			busy += sec.Busy[p]
		}
		parts = append(parts, fmt.Sprintf("%s %.1f%%", p, 100*float64(busy)/float64(max(all, 1))))
	}
	return "packets waiting in " + strings.Join(parts, ", ")
}
