package livelab

import (
	"fmt"
	"testing"
)

// TestWorkConservationVerdict checks the verdict on made-up seconds (no
// lab needed): starved seconds do not count, idle backlogged ones do.
func TestWorkConservationVerdict(t *testing.T) {
	const usable = 950e6
	full, thin := 945e6, 800e6
	for _, tc := range []struct {
		name       string
		backlogged []bool
		sums       []float64
		want       string
	}{
		{"all full", []bool{true, true, true, true, true, true}, []float64{thin, full, full, full, full, full}, "5/5 ok"},
		{"starved seconds are not the scheduler's", []bool{true, true, false, false, true, true, true, true}, []float64{full, full, thin, thin, full, full, full, full}, "5/5 ok"},
		{"one thin second in ten", []bool{true, true, true, true, true, true, true, true, true, true, true}, []float64{full, full, full, thin, full, full, full, full, full, full, full}, "9/10 ok"},
		{"backlogged while idle", []bool{true, true, true, true, true, true}, []float64{full, thin, thin, full, thin, full}, "2/5 scheduler"},
		{"too few seconds to judge", []bool{true, true, true, false, false, false}, []float64{full, thin, thin, thin, thin, thin}, "0/2 ok"},
	} {
		c := Conserved(tc.backlogged, tc.sums, usable)
		got := fmt.Sprintf("%d/%d ok", c.Full, c.Backlogged)
		if v := c.Verdict(usable); v != "" {
			got = fmt.Sprintf("%d/%d scheduler", c.Full, c.Backlogged)
			t.Logf("%s: %s", tc.name, v)
		}
		if got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}
