package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const simScenario = `name: tiny
seed: 1
duration: 2s
sample: 500ms
policy:
  cluster: t
  hosts:
    - {name: h1, cpu: {cores: 4, mhz: 2800}, memory: 8GiB, uplinks: [{name: u0, speed: 10Gbps, usable: 9.4Gbps}]}
  vms:
    - {name: a, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: n, shares: high}]}
    - {name: b, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: n, shares: low}]}
workloads:
  - {name: a, type: bulk, port: a/n, streams: 2}
  - {name: b, type: bulk, port: b/n, streams: 2}
expect:
  - {name: shares 4:1, metric: rate, of: a/n, relativeTo: {of: b/n}, from: 500ms, value: 4, tol: 0.2}
`

// TestSimCommand checks `sluice sim`: outputs written, exit 0 when every
// expectation holds, 1 when one fails or the scenario is bad (one line
// FILE:LINE: field: message), 2 on usage errors.
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", simScenario)
	failing := write("fail.yaml", strings.Replace(simScenario, "value: 4,", "value: 1,", 1))
	bad := write("bad.yaml", strings.Replace(simScenario, "type: bulk, port: b/n", "type: bulk, port: c/n", 1))
	out := filepath.Join(dir, "out")
	cases := []struct {
		args       []string
		code       int
		stdoutHas  string
		stderrWant string
	}{
		{[]string{"sim", good, "-o", out}, exitOK, "all expectations met", ""},
		{[]string{"sim", "-q", failing, "-o", filepath.Join(dir, "out2")}, exitBad, "", ""},
		{[]string{"sim", bad, "-o", filepath.Join(dir, "out3")}, exitBad, "", bad + ":14: port: unknown port \"c/n\" (VM/NIC or HOST/CLASS)\n"},
		{[]string{"sim"}, exitUsage, "", "usage: sluice sim SCENARIO [-o DIR] [-q] [--live FILE]\n"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.stdoutHas) || stderr.String() != c.stderrWant {
			t.Errorf("sluice %s: exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout with %q, stderr %q",
				strings.Join(c.args, " "), code, stdout.String(), stderr.String(), c.code, c.stdoutHas, c.stderrWant)
		}
	}
	for _, f := range []string{"summary.json", "summary.txt", "report.md", "series-main.csv", "main-throughput.svg", "main-throughput.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("output %s missing or empty: %v", f, err)
		}
	}
}
