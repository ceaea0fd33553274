package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestPlaceCLI runs `sluice place` in process on the command lines of
// testdata/place_cli.txt and compares exit code, stdout and stderr with
// the golden output. Rewrite with `go test ./cmd/sluice -run PlaceCLI -rewrite`.
func TestPlaceCLI(t *testing.T) {
	datadriven.RunTest(t, "testdata/place_cli.txt", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "sluice" {
			d.Fatalf(t, "unknown command %s", d.Cmd)
		}
		var stdout, stderr bytes.Buffer
		code := run(strings.Fields(d.Input), &stdout, &stderr)
		var b strings.Builder
		fmt.Fprintf(&b, "exit %d\n", code)
		b.WriteString(stdout.String())
		for _, l := range strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n") {
			if l != "" {
				fmt.Fprintf(&b, "stderr: %s\n", l)
			}
		}
		return b.String()
	})
}
