package livelab

import "fmt"

// MinCarried is the share of the usable rate that a host's flows, all of
// them backlogged, must carry together for a second to show a full link
// (HTB lets every class borrow up to the line rate).
const MinCarried = 0.97

// MinWorkConserved is the floor of a run's work conservation: of the
// seconds in which every class of the run's flows stayed backlogged (and
// no receiver fell behind), the share in which the link carried at least
// MinCarried of the usable rate. A work-conserving scheduler keeps such a
// link full; a scheduler that holds backlogged classes under the link
// (rates summing to less than the link, ceilings too low) fails here,
// named as the scheduler, while seconds that the machine starved of CPU (a
// class left empty, a receiver behind) are not counted either way. Ten
// runs of netlive's TestFig2StepA on this machine while quiet (2026-11-24
// 07:01–07:07 UTC; 30 judged measurements): 309 of 309 backlogged seconds
// full. A loaded host was seen to slow HTB in single seconds (90–95%
// carried), so the floor leaves a quarter of the seconds to the machine
// (docs/perf/network.md, "Work conservation").
const MinWorkConserved = 0.75

// minBackloggedForVerdict is how many backlogged seconds a run needs
// before its work conservation is held against the scheduler.
const minBackloggedForVerdict = 4

// Conservation is what a run says about work conservation.
type Conservation struct {
	Backlogged int   // seconds in which every class stayed backlogged and no receiver fell behind
	Full       int   // of those, seconds in which the link carried ≥ MinCarried of the usable rate
	Thin       []int // the backlogged seconds that were not full
}

// Share is Full/Backlogged (1 when nothing was backlogged).
func (c Conservation) Share() float64 {
	if c.Backlogged == 0 {
		return 1
	}
	return float64(c.Full) / float64(c.Backlogged)
}

// Verdict names the scheduler when c is under the floor, "" otherwise.
func (c Conservation) Verdict(usable float64) string {
	if c.Backlogged < minBackloggedForVerdict || c.Share() >= MinWorkConserved {
		return ""
	}
	return fmt.Sprintf("scheduler: classes backlogged while the link carried less than %.0f%% of the usable %.1f Mbps in %d of %d seconds (seconds %v; work conservation %.0f%%, floor %.0f%%)",
		100*MinCarried, usable/1e6, c.Backlogged-c.Full, c.Backlogged, c.Thin, 100*c.Share(), 100*MinWorkConserved)
}

// Conserved classifies seconds 1..n-1 of a run (second 0 is the flows'
// start, not all of them inside it): backlogged[i] says every class had
// packets waiting and no receiver fell behind, sums[i] is what all the
// run's flows carried.
func Conserved(backlogged []bool, sums []float64, usable float64) Conservation {
	var c Conservation
	for i := 1; i < len(backlogged) && i < len(sums); i++ {
		if !backlogged[i] {
			continue
		}
		c.Backlogged++
		if sums[i] >= MinCarried*usable {
			c.Full++
		} else {
			c.Thin = append(c.Thin, i)
		}
	}
	return c
}
