package parda

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// The array model of the tests: N parallel slots, each I/O holding a slot
// for an exponentially distributed service time with mean
// FixedNs + NsPerKiB·size/1024, a FIFO queue in front of the slots. With Q
// I/Os outstanding and Q > N the latency is about Q·S/N: it grows with the
// outstanding I/O of all hosts. Every host keeps round(window) I/Os
// outstanding while any of its VMs is active (closed loop, greedy VMs),
// and none when all are idle.

type arrayModel struct {
	slots int
	svc   SizeModel // service time of the array (RefBytes unused)
}

type simHost struct {
	name   string
	bytes  float64 // I/O size
	shares float64 // aggregate shares of the host's active VMs
	window float64
	out    int // outstanding
	// period accumulators
	ios    float64
	latSum float64
}

type shareChange struct {
	atNs   int64
	host   int
	shares float64
}

type ioReq struct {
	host    int
	issueNs int64
	doneNs  int64
}

type doneHeap []ioReq

func (h doneHeap) Len() int           { return len(h) }
func (h doneHeap) Less(i, j int) bool { return h[i].doneNs < h[j].doneNs }
func (h doneHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *doneHeap) Push(x any)        { *h = append(*h, x.(ioReq)) }
func (h *doneHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// periodSample is the state after one control period.
type periodSample struct {
	endNs     int64
	windows   []float64
	shares    []float64
	latencyNs float64 // datastore-wide, normalised
	iops      float64
}

// runArray drives the controller against the array model for durNs and
// returns one sample per control period.
// With scaled set the hosts use UpdateScaled, with the sums of the active
// hosts' shares and windows of the period that just ended.
func runArray(ctl *Controller, scaled bool, arr arrayModel, norm SizeModel, hosts []*simHost, changes []shareChange, durNs int64, seed uint64) []periodSample {
	rng := rand.New(rand.NewPCG(seed, 99))
	period := ctl.Config().PeriodNs
	var busy int
	var queue []ioReq // FIFO
	var done doneHeap
	now := int64(0)
	start := func(r ioReq) {
		mean := arr.svc.serviceNs(hosts[r.host].bytes)
		r.doneNs = now + int64(rng.ExpFloat64()*mean)
		heap.Push(&done, r)
		busy++
	}
	issue := func() {
		for i, h := range hosts {
			if h.shares <= 0 {
				continue
			}
			for h.out < int(math.Round(h.window)) {
				h.out++
				r := ioReq{host: i, issueNs: now}
				if busy < arr.slots {
					start(r)
				} else {
					queue = append(queue, r)
				}
			}
		}
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].atNs < changes[j].atNs })
	var out []periodSample
	nextPeriod := period
	issue()
	for now < durNs {
		for len(changes) > 0 && changes[0].atNs <= now {
			hosts[changes[0].host].shares = changes[0].shares
			changes = changes[1:]
		}
		if len(done) > 0 && done[0].doneNs <= nextPeriod {
			r := heap.Pop(&done).(ioReq)
			now = r.doneNs
			busy--
			h := hosts[r.host]
			h.out--
			h.ios++
			h.latSum += float64(now - r.issueNs)
			if len(queue) > 0 {
				q := queue[0]
				queue = queue[1:]
				start(q)
			}
			issue()
			continue
		}
		// End of a control period: every host computes the datastore
		// latency from all reports and updates its own window.
		now = nextPeriod
		nextPeriod += period
		reports := make([]HostReport, len(hosts))
		var ios float64
		for i, h := range hosts {
			if h.ios > 0 {
				reports[i] = HostReport{IOs: h.ios, LatencyNs: h.latSum / h.ios, MeanBytes: h.bytes}
			}
			ios += h.ios
		}
		lat := norm.DatastoreLatency(reports)
		s := periodSample{endNs: now, latencyNs: lat, iops: ios / (float64(period) / 1e9)}
		var totalShares, totalWindow float64
		for _, h := range hosts {
			if h.shares > 0 {
				totalShares += h.shares
				totalWindow += h.window
			}
		}
		for _, h := range hosts {
			if scaled {
				if h.shares > 0 {
					h.window = ctl.UpdateScaled(h.window, lat, h.shares, totalShares, totalWindow)
				}
			} else {
				h.window = ctl.Update(h.window, lat, h.shares)
			}
			h.ios, h.latSum = 0, 0
			s.windows = append(s.windows, h.window)
			s.shares = append(s.shares, h.shares)
		}
		out = append(out, s)
		issue()
	}
	return out
}

// phaseSummary checks the settled state of one phase [fromNs, toNs): over
// its second half, the mean window of each active host, their ratio
// against the ratio of shares (bound 10%), and the mean datastore latency
// against the threshold. Classic law: within [threshold, 1.3·threshold]
// and within 5% of the law's fixed point for this array. Scaled law
// (UpdateScaled): within ±5% of the threshold.
func phaseSummary(b *strings.Builder, ctl *Controller, scaled bool, arr arrayModel, hosts []*simHost, samples []periodSample, fromNs, toNs int64) {
	mid := fromNs + (toNs-fromNs)/2
	var n float64
	win := make([]float64, len(hosts))
	var lat float64
	var shares []float64
	for _, s := range samples {
		if s.endNs <= mid || s.endNs > toNs {
			continue
		}
		n++
		for i, w := range s.windows {
			win[i] += w
		}
		lat += s.latencyNs
		shares = s.shares
	}
	if n == 0 {
		b.WriteString("  (no samples)\n")
		return
	}
	// Recovery: from which period on the window ratios of the active hosts
	// stay within 10% of their share ratios until the end of the phase.
	settleNs := int64(-1)
	for _, s := range samples {
		if s.endNs <= fromNs || s.endNs > toNs {
			continue
		}
		if ratiosWithin(s, 0.10, ctl.Config()) {
			if settleNs < 0 {
				settleNs = s.endNs
			}
		} else {
			settleNs = -1
		}
	}
	lat /= n
	thr := ctl.Config().ThresholdNs
	fmt.Fprintf(b, "settled %s..%s:", fmtS(mid), fmtS(toNs))
	for i := range win {
		win[i] /= n
		fmt.Fprintf(b, " %s=%.1f", hosts[i].name, win[i])
	}
	fmt.Fprintf(b, " latency=%.2fms (threshold %.0fms)\n", lat/1e6, thr/1e6)
	if settleNs >= 0 {
		fmt.Fprintf(b, "  window ratios within 10%% of share ratios from %s after the phase start\n", fmtS(settleNs-fromNs))
	} else {
		b.WriteString("  window ratios not within 10% of share ratios at the end of the phase\n")
	}
	// Window ratios between active hosts, against their share ratios. A
	// host held at the window bounds cannot follow its shares: say so and
	// leave it out.
	ref := -1
	c := ctl.Config()
	for i := range win {
		if shares[i] <= 0 {
			continue
		}
		if win[i] <= c.Min*1.01 || win[i] >= c.Max*0.99 {
			fmt.Fprintf(b, "  %s held at the window bounds [%g, %g]\n", hosts[i].name, c.Min, c.Max)
			continue
		}
		if ref < 0 {
			ref = i
			continue
		}
		got := win[i] / win[ref]
		want := shares[i] / shares[ref]
		fmt.Fprintf(b, "  %s/%s windows %.3f, shares %.3f (err %+.1f%%)\n", hosts[i].name, hosts[ref].name, got, want, 100*(got/want-1))
		if math.Abs(got/want-1) > 0.10 {
			fmt.Fprintf(b, "  violation: window ratio off by more than 10%%\n")
		}
	}
	if scaled {
		fmt.Fprintf(b, "  latency %.3f× threshold (err %+.1f%%)\n", lat/thr, 100*(lat/thr-1))
		if math.Abs(lat/thr-1) > 0.05 {
			b.WriteString("  violation: latency more than 5% from the threshold\n")
		}
		return
	}
	// The fixed point of the law for this array: all slots busy, latency
	// L = Σw·S/N and w_i = β_i·L/(L−T) give L = T + S·Σβ/N.
	var sumBeta float64
	for i := range shares {
		sumBeta += ctl.Beta(shares[i])
	}
	if lat < thr || lat > 1.3*thr {
		b.WriteString("  violation: latency not within [1, 1.3]× threshold\n")
	}
	for _, h := range hosts {
		if h.bytes != hosts[0].bytes {
			fmt.Fprintf(b, "  latency %.3f× threshold (mixed I/O sizes: no fixed point computed)\n", lat/thr)
			return
		}
	}
	sMean := arr.svc.serviceNs(hosts[0].bytes)
	fixed := thr + sMean*sumBeta/float64(arr.slots)
	fmt.Fprintf(b, "  latency %.3f× threshold; fixed point of the law %.2fms (err %+.1f%%)\n", lat/thr, fixed/1e6, 100*(lat/fixed-1))
	if math.Abs(lat/fixed-1) > 0.05 {
		b.WriteString("  violation: latency more than 5% from the fixed point\n")
	}
}

// ratiosWithin says whether every active host's window, relative to the
// first active host's, is within tol of its share ratio (hosts held at
// the window bounds left out).
func ratiosWithin(s periodSample, tol float64, c Config) bool {
	ref := -1
	for i, sh := range s.shares {
		if sh <= 0 || s.windows[i] <= c.Min*1.01 || s.windows[i] >= c.Max*0.99 {
			continue
		}
		if ref < 0 {
			ref = i
			continue
		}
		got := s.windows[i] / s.windows[ref]
		want := sh / s.shares[ref]
		if math.Abs(got/want-1) > tol {
			return false
		}
	}
	return true
}

func fmtS(ns int64) string { return fmt.Sprintf("%gs", float64(ns)/1e9) }
