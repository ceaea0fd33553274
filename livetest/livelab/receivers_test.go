package livelab

import (
	"testing"
	"time"
)

// TestReceiversPerNamespace: receivers in two namespaces, read on tickers
// offset by 25 ms; each port is timed and measured by its own
// namespace's samples, and a window is timed only when both namespaces'
// reads near its ends were fast.
func TestReceiversPerNamespace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := fakeReceivers(t0, 3, 100e6, 2*time.Millisecond, nil)                         // port 5201, at t0 + k·50 ms
	b := fakeReceivers(t0.Add(25*time.Millisecond), 3, 40e6, 2*time.Millisecond, nil) // at t0 + 25 ms + k·50 ms
	for k := range b.bytes {
		b.bytes[k] = map[int]float64{5202: b.bytes[k][5201]}
	}
	w := &Receivers{series: a.series, more: []*series{&b.series}, of: map[int]int{5201: 0, 5202: 1}}
	tw := w.Window(t0.Add(time.Second), t0.Add(2*time.Second))
	if !tw.OK() {
		t.Fatalf("window not timed: %s", tw.Why())
	}
	for port, want := range map[int]float64{5201: 100e6, 5202: 40e6} {
		if r := w.Between(port, tw); r < want*0.999 || r > want*1.001 {
			t.Errorf("port %d: %.0f bits/s, want %.0f", port, r, want)
		}
		if r, ok := w.Rate(port, t0.Add(time.Second), t0.Add(2*time.Second)); !ok || r < want*0.999 || r > want*1.001 {
			t.Errorf("port %d: Rate %.0f bits/s (%v), want %.0f", port, r, ok, want)
		}
	}
	from, to := w.Ends(5202, tw)
	if from.Sub(t0)%(50*time.Millisecond) != 25*time.Millisecond || to.Sub(from) != time.Second {
		t.Errorf("port 5202 timed by %v–%v after t0, want its own namespace's samples", from.Sub(t0), to.Sub(t0))
	}
	// The second namespace's reads near t0+2s are slow: not timed.
	for k, at := range b.at {
		if d := at.Sub(t0.Add(2 * time.Second)); d > -MaxOff-time.Millisecond && d < MaxOff+time.Millisecond {
			b.span[k] = 3 * MaxSpan
		}
	}
	if tw := w.Window(t0.Add(time.Second), t0.Add(2*time.Second)); tw.OK() {
		t.Errorf("a window timed although one namespace's reads at its end took %v", 3*MaxSpan)
	}
	if got := w.Reads(t0, t0.Add(3*time.Second)); got == "no receiver reads" {
		t.Errorf("Reads: %s", got)
	}
}
