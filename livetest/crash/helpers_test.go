// Package crash kills sluice's daemons with SIGKILL while they work and
// starts them again, the way a machine loses them: the storage gateway
// under fio writes in a lab from `sluice lab up`, and the datastore (nbdkit)
// under a gateway. Nothing a client was told is written may be lost: fio
// verifies every block whose write it saw acknowledged, and a block may be
// wrong only where fio saw its write fail. The agent's crash test lives
// with the network tests (livetest/netlive, agentkill_test.go), whose
// judging of seconds it needs. The tests need root, ip, nbdkit, fio and
// go, and fail (not skip) without them.
package crash

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/livetest/livelab"
)

// sluiceBin is the sluice binary built for this run (TestMain).
var sluiceBin string

func TestMain(m *testing.M) {
	var err error
	if sluiceBin, err = livelab.SluiceBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func requireLive(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("crash tests need root (network namespaces); run as root")
	}
	for _, tool := range []string{"ip", "nbdkit", "fio", "ss"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("crash tests need %s (scripts/deps.sh installs it)", tool)
		}
	}
}

// daemon is a process a test started (in its own session, so that a
// SIGKILL reaches it and nothing else).
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startDaemon starts args (in network namespace ns unless "") with its
// output in logPath; cleanup kills it if it still runs.
func startDaemon(t *testing.T, ns, logPath string, args ...string) *daemon {
	t.Helper()
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", strings.Join(args, " "), err)
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() { d.kill() })
	return d
}

// kill sends SIGKILL and waits until the process is gone.
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// waitSocket polls until a Unix socket file exists.
func waitSocket(t *testing.T, path string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket %s after %s", path, within)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
	}
}

// fioRun is one fio job's outcome.
type fioRun struct {
	Err          error          // fio's exit
	JobError     int            // the job's error number (0: none)
	WriteIOs     int64          // write I/Os fio counted as done
	ReadIOs      int64          // reads (verification reads included)
	FailedWrites map[int64]bool // offsets of writes fio reported failed
	// Acked holds the offsets of the writes that completed successfully
	// (acknowledged), from fio's completion-latency log: only with the
	// option ackLog.
	Acked     map[int64]bool
	BadBlocks []int64 // offsets at which verification found wrong data
	Stderr    string
}

// runFio runs one fio job (options as key=value, ioengine nbd) in dir (its
// verify state files live there) inside namespace ns ("" for this one).
func runFio(ctx context.Context, dir, ns string, opts ...string) fioRun {
	return startFio(ctx, dir, ns, opts...).wait()
}

// fioProc is a running fio job: its progress as fio reports it, every
// livelab.FioStatusInterval, and its outcome.
type fioProc struct {
	*livelab.FioStream
	result chan fioRun
}

// startFio starts runFio's job and returns at once.
func startFio(ctx context.Context, dir, ns string, opts ...string) *fioProc {
	args := []string{"fio", "--name=crash", "--ioengine=nbd", "--output-format=json", "--status-interval=" + livelab.FioStatusInterval}
	for _, o := range opts {
		args = append(args, "--"+o)
	}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	p := &fioProc{result: make(chan fioRun, 1)}
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		p.FioStream = livelab.NewFioStream(strings.NewReader(""))
		p.result <- fioRun{Err: err}
		return p
	}
	p.FioStream = livelab.NewFioStream(out)
	go func() {
		final := p.Final() // fio's output ended
		r := fioRun{Err: cmd.Wait(), Stderr: errb.String()}
		if slices.Contains(opts, ackLog) {
			var err error
			if r.Acked, err = ackedWrites(filepath.Join(dir, ackLogName+"_clat.1.log")); err != nil && r.Err == nil {
				r.Err = err
			}
		}
		r.FailedWrites, r.BadBlocks = livelab.FailedWrites(r.Stderr), livelab.BadBlocks(r.Stderr)
		if j, err := livelab.ParseFioJob(final); err == nil {
			r.JobError, r.WriteIOs, r.ReadIOs = j.Error, j.Write.IOs, j.Read.IOs
		} else if r.Err == nil {
			r.Err = fmt.Errorf("fio's final report: %v", err)
		}
		p.result <- r
	}()
	return p
}

// wait waits for fio to end and returns its outcome.
func (p *fioProc) wait() fioRun { return <-p.result }

// waitWrites waits until fio reports at least n of its 4 KiB writes
// completed and returns the report; it fails the test, with fio's
// outcome, when fio ended first.
func (p *fioProc) waitWrites(t *testing.T, n int64) livelab.FioJob {
	t.Helper()
	j, ok := p.Wait(func(j livelab.FioJob) bool { return j.Write.KiB >= 4*n })
	if !ok {
		r := p.wait()
		t.Fatalf("fio ended after %d writes, before the %d the test waits for (%v, job error %d): %s", r.WriteIOs, n, r.Err, r.JobError, tailOf(r.Stderr))
	}
	return j
}

// ackLog makes fio log every completed I/O with its offset (write_lat_log
// with log_offset): fio adds a completion sample only for an I/O that
// succeeded, so the log's writes are exactly the acknowledged ones.
const (
	ackLogName = "acked"
	ackLog     = "write_lat_log=" + ackLogName
)

// withAckLog adds ackLog to a writer's options.
func withAckLog(opts []string) []string { return append(opts, ackLog, "log_offset=1") }

// ackedWrites reads the offsets of the writes in a fio completion-latency
// log.
func ackedWrites(path string) (map[int64]bool, error) {
	log, err := livelab.ReadFioLog(path)
	if err != nil {
		return nil, err
	}
	out := map[int64]bool{}
	for _, e := range log {
		if e.Dir == 1 {
			out[e.Offset] = true
		}
	}
	return out, nil
}

// lost returns the blocks that verification found wrong although one of
// the writers had its write of them acknowledged (writes run with ackLog);
// with no writers given, every wrong block (all were acknowledged).
func lost(verify fioRun, writes ...fioRun) []int64 {
	var out []int64
	for _, off := range verify.BadBlocks {
		acked := len(writes) == 0
		for _, w := range writes {
			acked = acked || w.Acked[off]
		}
		if acked {
			out = append(out, off)
		}
	}
	return out
}

func tailOf(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return s
}
