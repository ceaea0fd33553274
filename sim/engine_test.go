package sim

import (
	"fmt"
	"strings"
	"testing"
)

// Events fire in time order, ties in the order they were scheduled, and
// Run stops at its horizon with the clock there.
func TestEngineOrder(t *testing.T) {
	e := NewEngine(1)
	var got []string
	rec := func(s string) func() { return func() { got = append(got, fmt.Sprintf("%s@%d", s, e.NowNs())) } }
	e.At(30, rec("c"))
	e.At(10, rec("a"))
	e.At(10, rec("b"))
	e.At(20, func() {
		got = append(got, fmt.Sprintf("x@%d", e.NowNs()))
		e.After(0, rec("y")) // same time, after everything already due
		e.After(5, rec("z")) // 25
		e.At(1, rec("late")) // in the past: runs now
	})
	e.At(100, rec("never"))
	e.Run(50)
	want := "a@10 b@10 x@20 y@20 late@20 z@25 c@30"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("order:\n got %s\nwant %s", s, want)
	}
	if e.NowNs() != 50 || e.Pending() != 1 || e.Fired != 7 {
		t.Fatalf("after Run(50): now %d pending %d fired %d; want 50 1 7", e.NowNs(), e.Pending(), e.Fired)
	}
}

// The same seed gives the same random stream; another seed another one.
func TestEngineSeed(t *testing.T) {
	a, b, c := NewEngine(7), NewEngine(7), NewEngine(8)
	same := true
	for range 100 {
		x, y, z := a.Rand.Uint64(), b.Rand.Uint64(), c.Rand.Uint64()
		if x != y {
			t.Fatal("same seed, different streams")
		}
		same = same && x == z
	}
	if same {
		t.Fatal("different seeds, same stream")
	}
}

// The wire model: 10 GbE carries 1448/1538 of its line rate as payload.
func TestWirePayload(t *testing.T) {
	p := DefaultNetParams
	seg := p.SegmentBytes
	payload := float64(seg*8) / float64(p.wireBits(seg)) * 10e9
	if payload < 9.35e9 || payload > 9.45e9 {
		t.Fatalf("10GbE payload %.3g bps, want ~9.4e9", payload)
	}
}
