package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios (go test -rewrite regenerates the expected output) runs the small scenarios of testdata/*.txt: each "sim"
// command holds a scenario; the output is its summary (measured vs
// expected) followed by any invariant violations the harness finds.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "sim":
				sc, err := ParseScenario(filepath.Base(path), []byte(d.Input))
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				res, err := Run(sc)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return res.Summary.Text() + strings.Join(invariants(res), "")
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

// invariants checks what must hold in any run: no uplink sends more
// payload than its wire can carry, no datastore completes more I/Os than
// its slots can serve, every host window stays in [4, 256] under SIOC.
func invariants(res *Result) []string {
	var out []string
	for _, r := range res.Runs {
		s := r.sim
		iv := float64(s.rec.IntervalNs) / 1e9
		for _, up := range s.upOrder {
			maxBps := up.LineBps * float64(s.net.SegmentBytes*8) / float64(s.net.wireBits(s.net.SegmentBytes))
			ser := s.rec.series[prefLink+up.Host+"/"+up.Name]
			for i := range ser.Sum {
				if v := ser.Sum[i] / iv; v > maxBps*1.01 {
					out = append(out, fmt.Sprintf("violation: run %s: uplink %s/%s sent %.4g bps in sample %d, above %.4g\n", r.Name, up.Host, up.Name, v, i, maxBps))
				}
			}
		}
		for _, dn := range sortedKeys(s.dstores) {
			ds := s.dstores[dn]
			maxIOPS := float64(ds.slots) / (ds.st4kNs / 1e9)
			total := 0.0
			for _, n := range s.rec.names() {
				if hasPrefix(n, prefIOPS) {
					total += s.rec.series[n].Rate(0, res.Scenario.durNs)
				}
			}
			if total > maxIOPS*1.001 {
				out = append(out, fmt.Sprintf("violation: run %s: datastore %s served %.0f IOPS, above %.0f\n", r.Name, dn, total, maxIOPS))
			}
			for _, h := range ds.hosts {
				ser := s.rec.series[prefQDepth+h.name]
				for i := range ser.Sum {
					if ser.Cnt[i] > 0 && ds.sioc && (ser.Sum[i] < 4 || ser.Sum[i] > 256) {
						out = append(out, fmt.Sprintf("violation: run %s: window of %s is %.1f, outside [4, 256]\n", r.Name, h.name, ser.Sum[i]))
						break
					}
				}
			}
		}
	}
	return out
}

// runOutputs runs scenario src: its summary as JSON, its first run's
// series as CSV, and that run's simulation.
func runOutputs(t *testing.T, src string) (summary, csv string, s *Sim) {
	t.Helper()
	sc, err := ParseScenario("det.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(res.Summary)
	var b bytes.Buffer
	res.Runs[0].sim.rec.writeCSV(&b, sc.durNs, nil)
	return string(j), b.String(), res.Runs[0].sim
}

// Two runs of a scenario with the same seed write byte-identical
// summaries and series; another seed changes the storage series.
func TestDeterminism(t *testing.T) {
	data, err := os.ReadFile("testdata/scenarios.txt")
	if err != nil {
		t.Fatal(err)
	}
	// The storage scenario of the datadriven file (it uses randomness).
	text := string(data)
	i := strings.Index(text, "name: small-sioc")
	j := strings.Index(text[i:], "----")
	src := text[i : i+j]
	out := func(src string) (string, string) {
		j, c, _ := runOutputs(t, src)
		return j, c
	}
	j1, c1 := out(src)
	j2, c2 := out(src)
	if j1 != j2 || c1 != c2 {
		t.Fatal("same seed, different output")
	}
	_, c3 := out(strings.Replace(src, "seed: 1", "seed: 2", 1))
	if c1 == c3 {
		t.Fatal("seed 2 gave the same series as seed 1")
	}
}

// A bad scenario is one line FILE:LINE: field: message.
func TestBadScenario(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"name: x\nduration: 1s\npolicy: {cluster: c, hosts: [{name: h1}]}\nworkloads:\n  - {name: w, type: warp}\n", "bad.yaml:5: type: unknown workload type \"warp\""},
		{"name: x\nduration: soon\npolicy: {cluster: c, hosts: [{name: h1}]}\n", "bad.yaml:1: duration: bad time \"soon\""},
		{"name: x\nbogus: 1\n", "bad.yaml:2: scenario:"},
	} {
		_, err := ParseScenario("bad.yaml", []byte(tc.src))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("got %v, want one line starting %q", err, tc.want)
		}
	}
}

func TestParseValue(t *testing.T) {
	for in, want := range map[string]float64{"8.13Gbps": 8.13e9, "12ms": 12, "33%": 0.33, "1.5": 1.5} {
		got, err := parseValue(in)
		if err != nil || math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("parseValue(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}
