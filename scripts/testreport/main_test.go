package main

import (
	"bytes"
	"strings"
	"testing"
)

// A failing test's output is printed, a passing one's is not, and the
// summary lists package times, the slowest tests and the retried ones.
func TestReport(t *testing.T) {
	var b bytes.Buffer
	r := newReport(&b)
	for _, e := range []event{
		{Action: "run", Package: "p", Test: "TestA"},
		{Action: "output", Package: "p", Test: "TestA", Output: "    a_test.go:1: run 1: too few seconds judged; measuring again\n"},
		{Action: "pass", Package: "p", Test: "TestA", Elapsed: 30},
		{Action: "run", Package: "p", Test: "TestB"},
		{Action: "output", Package: "p", Test: "TestB", Output: "    b_test.go:9: want 1, got 2\n"},
		{Action: "fail", Package: "p", Test: "TestB", Elapsed: 2},
		{Action: "output", Package: "p", Output: "FAIL\tp\t32.1s\n"},
		{Action: "fail", Package: "p", Elapsed: 32.1},
		{Action: "output", Package: "q", Output: "ok  \tq\t1.0s\n"},
		{Action: "pass", Package: "q", Elapsed: 1},
	} {
		r.add(e)
	}
	r.summary(10)
	out := b.String()
	for _, want := range []string{"b_test.go:9: want 1, got 2", "FAIL\tp\t32.1s", "ok  \tq\t1.0s", "32.1 s  p  FAIL", "30.0 s  p TestA", "p TestA: 1 time(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "a_test.go:1") {
		t.Errorf("a passing test's output printed:\n%s", out)
	}
	if !r.failed {
		t.Error("a failed test: want the report failed")
	}
}
