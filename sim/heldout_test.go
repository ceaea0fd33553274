package sim

import (
	"os"
	"strings"
	"testing"
)

// heldOut is a variant of a seed scenario that no parameter was fitted
// to: other random seeds, loads or VM counts. The scenario's model
// parameters (models:, array:) are left as the seed scenario sets them.
type heldOut struct {
	name string
	file string // under scenarios/seeds
	// edits are literal replacements in the scenario's text; each must
	// match exactly once.
	edits [][2]string
	// expect names the expectations that must pass; empty: all of them.
	// Baseline figures (kind: baseline) describe the seed's own workload,
	// so a variant that changes the workload checks only the control
	// outcomes.
	expect []string
}

var exp2Met = []string{"reservation: response vs alone", "no reservation: slower than with", "no reservation: faster than FIFO"}

var heldOuts = []heldOut{
	// Exp. 2's row at 500 users is not met in the seed scenario itself
	// (docs/sim.md); the variants check the rows met there.
	{name: "exp2 seed 2", file: "netioc-exp2.yaml", edits: [][2]string{{"seed: 1\n", "seed: 2\n"}}, expect: exp2Met},
	{name: "exp2 75 users", file: "netioc-exp2.yaml", edits: [][2]string{{"users: 150,", "users: 75,"}}, expect: exp2Met},
	{name: "test1 seed 3", file: "sioc-test1.yaml", edits: [][2]string{{"seed: 1\n", "seed: 3\n"}}},
	{name: "test1 VM4 96 users", file: "sioc-test1.yaml", edits: [][2]string{{"users: 72,", "users: 96,"}},
		expect: []string{"sioc: VM4 share of IOPS", "sioc: VM1 share of IOPS", "VM4 latency sioc/default", "VM4 orders sioc/default", "VM4 order time sioc/default"}},
	{name: "test2 Iometer 8 outstanding", file: "sioc-test2.yaml", edits: [][2]string{{"outstanding: 12,", "outstanding: 8,"}},
		expect: []string{"sioc: orders vs alone"}},
	{name: "test2 Iometer 16 outstanding", file: "sioc-test2.yaml", edits: [][2]string{{"outstanding: 12,", "outstanding: 16,"}},
		expect: []string{"sioc: orders vs alone"}},
	{name: "test4 seed 2", file: "sioc-test4.yaml", edits: [][2]string{{"seed: 1\n", "seed: 2\n"}}},
}

// TestHeldOut runs variants of the seed scenarios with the models and
// calibrations the seed scenarios use, unchanged, and requires their
// expectations to hold: a model fitted to one scenario's numbers would
// miss them.
func TestHeldOut(t *testing.T) {
	if testing.Short() {
		t.Skip("runs variants of the seed scenarios (about 30 s); not in -short")
	}
	for _, h := range heldOuts {
		t.Run(h.name, func(t *testing.T) {
			data, err := os.ReadFile("../scenarios/seeds/" + h.file)
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			for _, e := range h.edits {
				if n := strings.Count(text, e[0]); n != 1 {
					t.Fatalf("edit %q matches %d times, want 1", e[0], n)
				}
				text = strings.Replace(text, e[0], e[1], 1)
			}
			sc, err := ParseScenario(h.file, []byte(text))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]bool{}
			for _, n := range h.expect {
				want[n] = true
			}
			seen := 0
			for _, o := range res.Summary.Expect {
				if len(want) > 0 && !want[o.Name] {
					continue
				}
				seen++
				if !o.Pass {
					t.Errorf("%s (%s): %s, expected %s", o.Name, o.Run, fmtVal(o.Measured, o.Unit), o.Expected)
				}
			}
			if len(want) > 0 && seen != len(want) {
				t.Errorf("found %d of the %d expectations named", seen, len(want))
			}
		})
	}
}
