// Package proptest sizes the property tests that check an invariant over
// random policies.
package proptest

import (
	"os"
	"strconv"
	"testing"
)

// RunsEnv overrides how many random cases a property test checks, for a
// deeper run than make test's (e.g. SLUICE_PROPERTY_RUNS=50000).
const RunsEnv = "SLUICE_PROPERTY_RUNS"

// Runs is how many random cases a property test checks: RunsEnv when set,
// else def (a tenth of it with -short). A value that is not a positive
// number fails the test.
func Runs(t testing.TB, def int) int {
	t.Helper()
	if v := os.Getenv(RunsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of cases", RunsEnv, v)
		}
		return n
	}
	if testing.Short() {
		return max(def/10, 1)
	}
	return def
}
