package livelab

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/lab"
	"sluice/policy"
)

// UpLab writes the policy text to dir/name, loads it and builds its lab
// with the lab's state in dir/state, after removing a leftover of a
// crashed run; at cleanup it removes the lab and fails the test if a
// namespace of it is left. It returns the policy, its file and the
// state directory.
func UpLab(t testing.TB, dir, name, text string) (p *policy.Policy, file, stateDir string) {
	t.Helper()
	file, stateDir = filepath.Join(dir, name), filepath.Join(dir, "state")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	_ = lab.Down(p.Cluster, stateDir) // a leftover of a crashed run
	t.Cleanup(func() {
		if err := lab.Down(p.Cluster, stateDir); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := lab.Existing(p.Cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces behind: %v", left)
		}
	})
	if _, err := lab.Up(p, lab.Options{StateDir: stateDir, PolicyFile: file}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	return p, file, stateDir
}

// SluiceBinary builds sluice/cmd/sluice from the source as it is now and
// returns the binary's path. The tests of a run share one binary,
// os.TempDir()/sluice-test-bin/sluice, which go build relinks only when
// a source changed (a link costs about 4 s on the 2-CPU test machine; an
// up-to-date check 0.3 s). A file lock serializes packages that build at
// once; go build renames a new binary into place (its work directory is
// in the same os.TempDir()), so a process running the old one is not
// disturbed.
func SluiceBinary() (string, error) {
	dir := filepath.Join(os.TempDir(), "sluice-test-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "sluice/cmd/sluice").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// MustSluiceBinary is SluiceBinary for one test: it fails the test when
// the build fails.
func MustSluiceBinary(t testing.TB) string {
	t.Helper()
	bin, err := SluiceBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Controller is a `sluice controller` process that StartController
// started.
type Controller struct {
	Cmd   *exec.Cmd
	Ready time.Duration // from the process's start to its ready line
}

// StartController starts `bin controller --data-dir dataDir args...` and
// waits for its ready line (at most 30 s). Its stderr goes to
// dataDir.stderr (appended: a restart on the same directory adds to it),
// shown in the test's log if the test failed; it is killed at cleanup.
func StartController(t testing.TB, bin, dataDir string, args []string) *Controller {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(bin, append([]string{"controller", "--data-dir", dataDir}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logPath := strings.TrimSuffix(dataDir, "/") + ".stderr"
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &Controller{Cmd: cmd}
	t.Cleanup(func() {
		d.Kill()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("the controller's stderr (%s):\n%s", logPath, b)
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-lines:
		if !strings.Contains(l, "ready") {
			t.Fatalf("controller: %s", l)
		}
		d.Ready = time.Since(start)
		t.Logf("%s (process up to ready: %v)", l, d.Ready.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		b, _ := os.ReadFile(logPath)
		t.Fatalf("controller not ready after 30 s: %s", b)
	}
	return d
}

// Kill sends SIGKILL (kill -9) and reaps the process.
func (d *Controller) Kill() {
	if d.Cmd.ProcessState != nil {
		return
	}
	_ = d.Cmd.Process.Kill()
	_ = d.Cmd.Wait()
}

// StartSluice runs `bin args...` until the test ends, when it gets sig
// (in a session of its own); its output goes to dir/NAME.log, and into
// the test's log if the test failed.
func StartSluice(t testing.TB, bin, dir, name string, sig syscall.Signal, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(sig)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s's log:\n%s", name, b)
		}
	})
}

// Ctl runs `bin ctl conn... args...` and returns its stdout and stderr;
// an exit code other than want fails the test.
func Ctl(t testing.TB, bin string, conn []string, want int, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{"ctl"}, conn...), args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != want {
		t.Fatalf("sluice ctl %s: exit %d, want %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, want, stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

// FreePort is a TCP port on 127.0.0.1 that nothing listened on a moment
// ago (for a daemon the test starts next).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
