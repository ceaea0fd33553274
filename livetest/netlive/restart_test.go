package netlive

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestAgentRestartLive: the agent is stopped and a new one started while
// three VMs send, once the flows are steady (waitSteady: the agent
// converged) and two seconds more have passed; the new agent keeps the
// rates it finds, so no VM's per-second rate moves by more than 10% from
// its median around the restart. Two seconds whose counts TCP displaced
// (the judge's Late marks: 66 then 94 Mbps at 80, in a make test run of
// 2026-11-27) are judged by their mean.
func TestAgentRestartLive(t *testing.T) {
	l := upLab(t, strings.ReplaceAll(fig2Policy, "cluster: nf2", "cluster: nrs"))
	const steadyWithin, beforeS, afterS = 10 * time.Second, 2, 4
	const durS = int(steadyWithin/time.Second) + beforeS + afterS + 2
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	var steadyS, restartS float64
	var steadyErr error
	// The seconds around the restart (the one before it, the one it
	// falls in and the two after) must all be judged.
	first := func() int { return int(math.Floor(restartS)) - 1 }
	around := func(short []bool) bool {
		i := first()
		return steadyErr == nil && i >= 0 && len(short) > i+3 && countJudged(short[i:i+4], 0) == 4 && countJudged(short, int(math.Ceil(steadyS))) >= 4
	}
	res := l.judged("h1", ports, 0, around, func(t0 time.Time) []result {
		_, stop := l.runAgent(nil, "h1", true)
		results := make(chan []result, 1)
		go func() {
			results <- l.runFlows(durS, l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1), l.nicFlow(ports[2], 1))
		}()
		steady, err := l.waitSteady("h1", ports, steadyWithin)
		if steadyErr = err; err != nil {
			stop()
			return <-results
		}
		steadyS = steady.Sub(t0).Seconds()
		time.Sleep(time.Until(steady.Add(beforeS * time.Second))) // the seconds judged before the restart
		stop()
		restartS = time.Since(t0).Seconds()
		_, stop = l.runAgent(nil, "h1", true)
		defer stop()
		return <-results
	})
	if steadyErr != nil {
		t.Fatalf("the agent did not bring the flows to steady rates: %v", steadyErr)
	}
	from := int(math.Ceil(steadyS))
	for _, r := range res {
		med := r.median(from)
		t.Logf("%s per second (steady at %.1f s, agent restarted at %.1f s): %s; median %s Mbps", r.Name, steadyS, restartS, r.series(), mbps(med))
		for i := first(); i < len(r.Intervals) && i <= first()+3; i++ {
			got, what, ok := r.secondRate(t, i, first())
			if !ok {
				continue
			}
			if e := relErr(got, med); math.Abs(e) > 0.10 {
				t.Errorf("%s %s: %s Mbps, %+.0f%% from its median %s around the restart", r.Name, what, mbps(got), 100*e, mbps(med))
			}
		}
	}
}
