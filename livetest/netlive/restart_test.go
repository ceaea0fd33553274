package netlive

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestAgentRestartLive: the agent is stopped and a new one started while
// three VMs send; the new agent keeps the rates it finds, so no VM's
// per-second rate moves by more than 10% from its median around the restart.
func TestAgentRestartLive(t *testing.T) {
	l := upLab(t, strings.ReplaceAll(fig2Policy, "cluster: nf2", "cluster: nrs"))
	const durS, restartAtS = convergeS + 6, convergeS + 2
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	// The seconds around the restart must all be judged.
	around := func(short []bool) bool {
		return len(short) > restartAtS+2 && countJudged(short[restartAtS-1:restartAtS+3], 0) == 4 && countJudged(short, convergeS) >= 4
	}
	res := l.judged("h1", ports, 0, around, func() []result {
		_, stop := l.runAgent(nil, "h1", true)
		results := make(chan []result, 1)
		go func() {
			results <- l.runFlows(durS, l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1), l.nicFlow(ports[2], 1))
		}()
		time.Sleep(restartAtS * time.Second) // the restart's place in the traffic schedule
		stop()
		_, stop = l.runAgent(nil, "h1", true)
		defer stop()
		return <-results
	})
	for _, r := range res {
		med := r.median(convergeS)
		t.Logf("%s per second (agent restarted at ~%d s): %s; median %s Mbps", r.Name, restartAtS, r.series(), mbps(med))
		for i := restartAtS - 1; i < len(r.Intervals) && i <= restartAtS+2; i++ {
			if e := relErr(r.Intervals[i], med); math.Abs(e) > 0.10 {
				t.Errorf("%s second %d: %s Mbps, %+.0f%% from its median %s around the restart", r.Name, i, mbps(r.Intervals[i]), 100*e, mbps(med))
			}
		}
	}
}
