package policyfile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"

	"sluice/policy"
)

// tickClock is a Clock whose ticker ticks when the test sends on ticks.
type tickClock struct{ ticks chan time.Time }

func (tickClock) Now() time.Time { return time.Time{} }

func (c tickClock) NewTicker(time.Duration) (<-chan time.Time, func()) { return c.ticks, func() {} }

func (tickClock) AfterFunc(time.Duration, func()) func() bool {
	panic("Watch uses no timer")
}

// TestWatch runs testdata/*.txt, each file against one policy file and
// one Watch. Regenerate expectations with
// `go test ./policyfile -run TestWatch -rewrite` and review the diff.
//
// Commands:
//
//	write [same-mtime]   the input becomes the policy file's content;
//	                     same-mtime: its modification time stays as it was
//	start [from=none]    starts the Watch (Every 1 s on a fake clock), From
//	                     the file's stamp now (none: "")
//	apply ok|fail        Apply succeeds, or fails with the input as its
//	                     error, from now on
//	poll                 one tick of the Watch's clock
//	hup                  one value on Reload
//
// poll and hup print what the Watch then did, once it waits again
// (testing/synctest): each policy applied (its cluster and VMs) and each
// line logged.
func TestWatch(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		dir := t.TempDir()
		synctest.Test(t, func(t *testing.T) { runWatchFile(t, path, dir) })
	})
}

func runWatchFile(t *testing.T, path, dir string) {
	file := filepath.Join(dir, "p.yaml")
	clk := tickClock{ticks: make(chan time.Time)}
	reload := make(chan os.Signal)
	var (
		mu       sync.Mutex
		did      []string // applied and logged since the last command
		applyErr string
	)
	record := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		did = append(did, strings.ReplaceAll(line, dir+string(filepath.Separator), ""))
	}
	w := &Watch{Path: file, Every: time.Second, Reload: reload, Clock: clk,
		Apply: func(p *policy.Policy) error {
			var vms []string
			for _, vm := range p.VMs {
				vms = append(vms, vm.Name)
			}
			record(fmt.Sprintf("applied: cluster %s, vms [%s]", p.Cluster, strings.Join(vms, " ")))
			mu.Lock()
			defer mu.Unlock()
			if applyErr != "" {
				return errors.New(applyErr)
			}
			return nil
		},
		Log: func(level slog.Level, msg string) { record(level.String() + " " + msg) }}
	started := false
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "write":
			fi, statErr := os.Stat(file)
			if err := os.WriteFile(file, []byte(d.Input), 0o644); err != nil {
				t.Fatal(err)
			}
			if d.HasArg("same-mtime") {
				if statErr != nil {
					t.Fatal(statErr)
				}
				if err := os.Chtimes(file, time.Time{}, fi.ModTime()); err != nil {
					t.Fatal(err)
				}
			}
			return ""
		case "start":
			if started {
				d.Fatalf(t, "started twice")
			}
			started = true
			if d.HasArg("from") {
				var from string
				d.ScanArgs(t, "from", &from)
				if from != "none" {
					d.Fatalf(t, "from=%s: want from=none", from)
				}
			} else {
				w.From = Stamp(file)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { w.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			return ""
		case "apply":
			mu.Lock()
			defer mu.Unlock()
			switch {
			case d.HasArg("ok"):
				applyErr = ""
			case d.HasArg("fail") && d.Input != "":
				applyErr = d.Input
			default:
				d.Fatalf(t, "want apply ok, or apply fail with the error as input")
			}
			return ""
		case "poll", "hup":
			if !started {
				d.Fatalf(t, "%s before start", d.Cmd)
			}
			if d.Cmd == "poll" {
				clk.ticks <- time.Time{}
			} else {
				reload <- syscall.SIGHUP
			}
			synctest.Wait() // the Watch is done with it
			mu.Lock()
			defer mu.Unlock()
			out := strings.Join(did, "\n")
			did = nil
			return out
		default:
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		}
	})
}
