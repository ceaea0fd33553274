package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestAllocExplainCLI runs `sluice alloc` and `sluice explain` in process
// on the command lines of testdata/alloc_cli.txt (one per case, the input)
// and compares exit code, stdout and stderr with the golden output. Rewrite
// with `go test ./cmd/sluice -run AllocExplainCLI -rewrite`.
func TestAllocExplainCLI(t *testing.T) {
	datadriven.RunTest(t, "testdata/alloc_cli.txt", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "sluice" {
			d.Fatalf(t, "unknown command %s", d.Cmd)
		}
		args := strings.Fields(d.Input)
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
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
