package netlive

import (
	"strings"
	"testing"
)

// secondRate judges a displaced pair inside the judged seconds by its
// mean once, and a displaced second whose partner lies outside them
// (before from, or after the run) by what its class sent: the two
// failures of a make test run of 2026-11-27 (80 Mbps read as 71 then 89
// across the first judged second; 69 read as 61.5 in a run's last second).
func TestSecondRateDisplaced(t *testing.T) {
	r := result{
		Name:      "vm2/nic0",
		Intervals: []float64{80e6, 71e6, 89e6, 80e6, 69e6, 61.5e6},
		Late:      []bool{false, true, true, false, true, true},
		Sent:      []float64{80e6, 80e6, 80e6, 80e6, 69e6, 68.9e6},
	}
	type judged struct {
		got  float64
		what string
		ok   bool
	}
	at := func(i, from int) judged {
		got, what, ok := r.secondRate(t, i, from)
		return judged{got, what, ok}
	}
	for _, c := range []struct {
		i, from int
		want    float64
		ok      bool
		what    string
	}{
		{0, 0, 80e6, true, "second 0"},
		{1, 0, 80e6, true, "seconds 1–2"},     // the pair's mean
		{2, 0, 0, false, ""},                  // judged with second 1
		{2, 2, 80e6, true, "second 2 (its"},   // partner before from: the class's
		{4, 3, 65.25e6, true, "seconds 4–5"},  // a pair at the end
		{5, 5, 68.9e6, true, "second 5 (its"}, // partner before from
	} {
		j := at(c.i, c.from)
		if j.ok != c.ok || j.got != c.want || !strings.HasPrefix(j.what, c.what) {
			t.Errorf("second %d from %d: %.2f Mbps %q ok %v, want %.2f %q… ok %v", c.i, c.from, j.got/1e6, j.what, j.ok, c.want/1e6, c.what, c.ok)
		}
	}
	// The run's last second alone displaced (bytes held past the end).
	r.Late = []bool{false, false, false, false, false, true}
	if j := at(5, 1); !j.ok || j.got != 68.9e6 {
		t.Errorf("last second: %.2f Mbps %q ok %v, want its class's 68.90", j.got/1e6, j.what, j.ok)
	}
}
