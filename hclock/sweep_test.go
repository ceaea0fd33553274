package hclock

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

var sweep = flag.Int("sweep", 0, "run this many extra random trees per demand kind (long; for finding counterexamples)")

// TestRandomSweep runs many random trees and fails on any invariant
// violation. It is off by default (make test stays short); run with
// `go test ./hclock -run RandomSweep -sweep=50 -v`.
func TestRandomSweep(t *testing.T) {
	if *sweep == 0 {
		t.Skip("enable with -sweep=N")
	}
	for _, demand := range []string{"greedy", "bursty", "mixed"} {
		for _, size := range []string{"1500", "mix"} {
			worst := 0.0
			for seed := 100; seed < 100+*sweep; seed++ {
				a := []datadriven.CmdArg{
					{Key: "seed", Vals: []string{fmt.Sprint(seed)}},
					{Key: "classes", Vals: []string{"4"}},
					{Key: "ports", Vals: []string{"5"}},
					{Key: "packets", Vals: []string{"1e6"}},
					{Key: "demand", Vals: []string{demand}},
					{Key: "size", Vals: []string{size}},
				}
				out := randomCmd(t, a)
				if strings.Contains(out, "VIOLATION") {
					t.Errorf("seed=%d demand=%s size=%s:\n%s", seed, demand, size, out)
				}
				var w float64
				fmt.Sscanf(out[strings.LastIndex(out, "largest port error ")+len("largest port error "):], "%f", &w)
				worst = max(worst, w)
			}
			t.Logf("demand=%s size=%s: %d trees, largest port error %.1f%%", demand, size, *sweep, worst)
		}
	}
}
