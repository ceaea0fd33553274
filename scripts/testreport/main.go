// Command testreport reads `go test -json` on stdin and prints what a
// plain `go test` prints (each package's result line, the output of the
// tests that failed), then a summary: each package's time, the slowest
// tests, and the tests that measured again (a live test that logged
// "measuring again": the machine starved a run) or were set aside, so
// that a slow drift shows up in CI's log. It exits 1 when a test or a
// package failed or the input ended early, as go test would have.
//
// Usage: go test -json ./... | go run ./scripts/testreport [-slowest N]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of go test -json (test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type testKey struct{ pkg, test string }

type report struct {
	out      io.Writer
	output   map[testKey][]string // output of a running test (or package, Test "")
	pkgTime  map[string]float64
	pkgFail  map[string]bool
	tests    map[testKey]float64 // top-level tests' elapsed seconds
	retried  map[testKey]int     // "measuring again" lines
	failed   bool
	finished map[string]bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, output: map[testKey][]string{}, pkgTime: map[string]float64{}, pkgFail: map[string]bool{},
		tests: map[testKey]float64{}, retried: map[testKey]int{}, finished: map[string]bool{}}
}

// add takes one event.
func (r *report) add(e event) {
	k := testKey{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
	case "build-fail":
		r.failed = true
	case "output":
		r.output[k] = append(r.output[k], e.Output)
		if e.Test != "" && strings.Contains(e.Output, "measuring again") {
			r.retried[testKey{e.Package, topLevel(e.Test)}]++
		}
		if e.Test == "" && (strings.HasPrefix(e.Output, "ok ") || strings.HasPrefix(e.Output, "FAIL\t") || strings.HasPrefix(e.Output, "?")) {
			fmt.Fprint(r.out, e.Output) // the package's result line
		}
	case "pass", "skip":
		if e.Test == "" {
			r.pkgTime[e.Package] = e.Elapsed
			r.finished[e.Package] = true
		} else if !strings.Contains(e.Test, "/") {
			r.tests[k] = e.Elapsed
		}
		delete(r.output, k)
	case "fail":
		r.failed = true
		if e.Test == "" {
			r.pkgTime[e.Package] = e.Elapsed
			r.pkgFail[e.Package] = true
			r.finished[e.Package] = true
			// Output outside any test (a build error, a panic, TestMain).
			for _, line := range r.output[k] {
				if !strings.HasPrefix(line, "FAIL") && !strings.HasPrefix(line, "ok ") {
					fmt.Fprint(r.out, line)
				}
			}
		} else {
			if !strings.Contains(e.Test, "/") {
				r.tests[k] = e.Elapsed
			}
			for _, line := range r.output[k] {
				fmt.Fprint(r.out, line)
			}
		}
		delete(r.output, k)
	}
}

func topLevel(test string) string {
	name, _, _ := strings.Cut(test, "/")
	return name
}

// summary prints the packages by time, the slowest tests and the retried
// ones.
func (r *report) summary(slowest int) {
	fmt.Fprintf(r.out, "\n== test times (go test -json) ==\n")
	var pkgs []string
	total := 0.0
	for p, s := range r.pkgTime {
		pkgs = append(pkgs, p)
		total += s
	}
	sort.Slice(pkgs, func(i, j int) bool { return r.pkgTime[pkgs[i]] > r.pkgTime[pkgs[j]] })
	fmt.Fprintf(r.out, "packages, slowest first (%.0f s in all):\n", total)
	for _, p := range pkgs {
		mark := ""
		if r.pkgFail[p] {
			mark = "  FAIL"
		}
		fmt.Fprintf(r.out, "  %7.1f s  %s%s\n", r.pkgTime[p], p, mark)
	}
	var tests []testKey
	for k := range r.tests {
		tests = append(tests, k)
	}
	sort.Slice(tests, func(i, j int) bool { return r.tests[tests[i]] > r.tests[tests[j]] })
	fmt.Fprintf(r.out, "the %d slowest tests:\n", min(slowest, len(tests)))
	for _, k := range tests[:min(slowest, len(tests))] {
		fmt.Fprintf(r.out, "  %7.1f s  %s %s\n", r.tests[k], k.pkg, k.test)
	}
	if len(r.retried) == 0 {
		fmt.Fprintf(r.out, "no test measured again\n")
		return
	}
	var retried []testKey
	for k := range r.retried {
		retried = append(retried, k)
	}
	sort.Slice(retried, func(i, j int) bool { return retried[i].pkg+retried[i].test < retried[j].pkg+retried[j].test })
	fmt.Fprintf(r.out, "tests that measured again (the machine starved a run; each run's evidence is in the test's log with -v):\n")
	for _, k := range retried {
		fmt.Fprintf(r.out, "  %s %s: %d time(s)\n", k.pkg, k.test, r.retried[k])
	}
}

func main() {
	slowest := flag.Int("slowest", 10, "how many of the slowest tests to list")
	flag.Parse()
	r := newReport(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Println(sc.Text()) // not test2json: pass it on
			continue
		}
		r.add(e)
	}
	r.summary(*slowest)
	for p := range r.output {
		if p.test == "" && !r.finished[p.pkg] {
			fmt.Printf("%s: no result (go test ended early)\n", p.pkg)
			r.failed = true
		}
	}
	if r.failed {
		os.Exit(1)
	}
}
