package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateCommand checks `sluice validate`: exit codes, the one-line
// summary, and one `FILE:LINE: field: message` line per problem.
func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("cluster: c\nhosts:\n  - name: h\n    uplinks: [{name: u, speed: 10Gbs}]\nvms:\n  - name: v\n    host: h\n    nics: [{name: n, reservaton: 1Gbps}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"validate", "../../examples/netioc-fig2.yaml"}, exitOK,
			"../../examples/netioc-fig2.yaml: ok: 2 hosts, 3 VMs, 3 vNICs, 0 disks, 0 datastores\n", ""},
		{[]string{"validate", bad}, exitBad, "",
			bad + ":4: hosts[h].uplinks[u].speed: unknown unit \"Gbs\" in \"10Gbs\" (want one of bps, Kbps, Mbps, Gbps, Tbps) (did you mean \"Gbps\"?)\n" +
				bad + ":8: vms[v].nics[n].reservaton: unknown field (did you mean \"reservation\"?)\n"},
		{[]string{"validate", filepath.Join(dir, "missing.yaml")}, exitBad, "", "sluice: " + filepath.Join(dir, "missing.yaml") + ": no such file or directory\n"},
		{[]string{"validate"}, exitUsage, "", "usage: sluice validate FILE\n"},
		{[]string{"validate", "a", "b"}, exitUsage, "", "usage: sluice validate FILE\n"},
		{[]string{"validate", "--bogus"}, exitUsage, "", "usage: sluice validate FILE\n"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != c.code || stdout.String() != c.stdout || stderr.String() != c.stderr {
			t.Errorf("sluice %s: exit %d\nstdout %q\nstderr %q\nwant exit %d\nstdout %q\nstderr %q",
				strings.Join(c.args, " "), code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderr)
		}
	}
}

// TestExamplesValidate: every example file is valid.
func TestExamplesValidate(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 4 {
		t.Fatalf("found %d examples", len(files))
	}
	for _, f := range files {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"validate", f}, &stdout, &stderr); code != exitOK {
			t.Errorf("%s: exit %d: %s", f, code, stderr.String())
		}
	}
}
