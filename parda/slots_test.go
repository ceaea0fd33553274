package parda

import (
	"math"
	"testing"
)

// meanOutstanding runs a backlogged host under window w for durNs: every
// request takes latNs at the datastore, and the host starts requests
// whenever Slots allows (after each completion and at the start). It
// returns the time-average of the requests outstanding.
func meanOutstanding(w float64, latNs, durNs int64) float64 {
	var s Slots
	var done []int64 // completion times of the outstanding requests, in order
	now, area := int64(0), 0.0
	fill := func() {
		for s.Allow(now, len(done), w) {
			done = append(done, now+latNs)
			s.Note(now, len(done), w)
		}
	}
	fill()
	for now < durNs {
		next := done[0]
		area += float64(len(done)) * float64(next-now)
		now = next
		done = done[1:]
		s.Note(now, len(done), w)
		fill()
	}
	return area / float64(now)
}

// A backlogged host keeps its window of requests outstanding on average,
// fractions included; below one request it keeps one.
func TestSlotsMeanIsWindow(t *testing.T) {
	for _, w := range []float64{0.5, 1, 1.25, 1.5, 2, 2.1, 2.4, 2.9, 3, 7.75, 32.3} {
		got := meanOutstanding(w, 10e6, 100e9)
		want := math.Max(1, w)
		if math.Abs(got-want) > 0.01*want {
			t.Errorf("window %.2f: %.3f requests outstanding on average, want %.3f", w, got, want)
		}
	}
}

// Two backlogged hosts with windows 2.1 and 2.9 at the same latency get
// IOPS in the ratio of their windows, not the 3:3 of rounding up.
func TestSlotsRatio(t *testing.T) {
	a, b := meanOutstanding(2.1, 10e6, 100e9), meanOutstanding(2.9, 10e6, 100e9)
	if r := b / a; math.Abs(r-2.9/2.1) > 0.01*2.9/2.1 {
		t.Errorf("windows 2.9 and 2.1: ratio of requests outstanding %.3f, want %.3f", r, 2.9/2.1)
	}
}

// A host that was idle builds no burst: after a long pause the extra
// request starts once, not many.
func TestSlotsNoBurst(t *testing.T) {
	var s Slots
	s.Note(0, 0, 2.5)
	now := int64(3600e9)
	n := 0
	for s.Allow(now, n, 2.5) {
		n++
		s.Note(now, n, 2.5)
	}
	if n != 3 {
		t.Fatalf("after an hour idle, %d requests started at once under window 2.5, want 3", n)
	}
}
