package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// baselineFile lists, one per line, every seed expectation that the
// simulator meets today (`SCENARIO: EXPECTATION (RUN)`). It is committed:
// a change that makes one of them fail fails the test, and one that makes
// a new one pass is reported, to be added with -rewrite.
const baselineFile = "../scenarios/seeds/baseline.txt"

// TestSeedBaseline runs every scenario of scenarios/seeds (what `make
// reproduce` runs) and fails when an expectation of the baseline is no
// longer met. `go test ./sim -run TestSeedBaseline -rewrite` writes the
// baseline anew from what is met now; review its diff like code.
func TestSeedBaseline(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every seed scenario (about a minute); not in -short")
	}
	files, err := filepath.Glob("../scenarios/seeds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no seed scenarios found (%v)", err)
	}
	sort.Strings(files)
	var met []string
	total := 0
	for _, f := range files {
		sc, err := LoadScenario(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		res, err := Run(sc)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		for _, o := range res.Summary.Expect {
			total++
			if o.Pass {
				met = append(met, fmt.Sprintf("%s: %s (%s)", name, o.Name, o.Run))
			}
		}
	}
	t.Logf("seed expectations met: %d of %d", len(met), total)
	if f := flag.Lookup("rewrite"); f != nil && f.Value.String() == "true" { // datadriven's flag
		body := "# Seed expectations the simulator meets (TestSeedBaseline; regenerate with -rewrite).\n" + strings.Join(met, "\n") + "\n"
		if err := os.WriteFile(baselineFile, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(baselineFile)
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]bool{}
	for _, m := range met {
		now[m] = true
	}
	base := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		base[line] = true
		if !now[line] {
			t.Errorf("no longer met: %s", line)
		}
	}
	for _, m := range met {
		if !base[m] {
			t.Logf("newly met (add it with -rewrite): %s", m)
		}
	}
}
