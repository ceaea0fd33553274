package policy

import (
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the loader. It must never panic; a
// rejected input gives Errors whose every line is `FILE:LINE: ...` on one
// line; an accepted input satisfies the admission invariants. The seed
// corpus is testdata/fuzz/FuzzParse (examples, bad files, edge cases); the
// normal test run executes it.
func FuzzParse(f *testing.F) {
	f.Add([]byte("cluster: a\nhosts: [{name: h, uplinks: [{name: u, speed: 1Gbps}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		if err != nil {
			if p != nil {
				t.Fatal("policy and error both returned")
			}
			errs, ok := err.(Errors)
			if !ok || len(errs) == 0 {
				t.Fatalf("error %T %v is not a non-empty Errors", err, err)
			}
			for _, e := range errs {
				if strings.HasPrefix(e.Msg, "internal error") {
					t.Fatalf("the loader panicked (recovered): %s", e.Msg)
				}
				line := e.Error()
				if !strings.HasPrefix(line, "f.yaml:") || e.Line < 1 || strings.ContainsAny(line, "\n\r") {
					t.Fatalf("malformed message %q", line)
				}
			}
			return
		}
		if v := checkInvariants(p); v != "" {
			t.Fatalf("accepted policy breaks invariants:\n%s", v)
		}
		if len(p.Hosts) == 0 || p.Cluster == "" {
			t.Fatal("accepted policy without hosts or cluster")
		}
	})
}
