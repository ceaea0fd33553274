// Package ctllive runs the real `sluice controller` binary and talks to it
// with the real `sluice ctl`: a policy applied, a reservation set, the
// event with its reason, then kill -9 and a restart on the same data
// directory with nothing lost (TestControllerCtl, no root); and seed
// Fig. 2 end to end in a lab with real agents on the controller, iperf3
// throughout, DRS migrating VMs by itself and a kill -9 of the controller
// mid-run (TestFig2DRSLive, root: network namespaces, tc, iperf3).
package ctllive

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var bin string // the sluice binary built for the tests

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ctllive-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "sluice/cmd/sluice").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// daemon is a running `sluice controller`.
type daemon struct {
	cmd   *exec.Cmd
	ready time.Duration
}

// startController starts the controller on dir and waits for its ready line.
func startController(t *testing.T, dir string, args []string) *daemon {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(bin, append([]string{"controller", "--data-dir", dir}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "..", filepath.Base(dir)+".stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd}
	t.Cleanup(func() { d.kill() })
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
		d.ready = time.Since(start)
		t.Logf("%s (process up to ready: %v)", l, d.ready.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		stderr, _ := os.ReadFile(logf.Name())
		t.Fatalf("controller not ready after 30 s: %s", stderr)
	}
	return d
}

// kill sends SIGKILL (kill -9) and reaps the process.
func (d *daemon) kill() {
	if d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}

// ctl runs `sluice ctl` with the connection flags and returns its stdout,
// failing the test on a non-zero exit unless wantCode says otherwise.
func ctl(t *testing.T, conn []string, wantCode int, args ...string) string {
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
	if code != wantCode {
		t.Fatalf("sluice ctl %s: exit %d, want %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, wantCode, stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

func TestControllerCtl(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	port := freePort(t)
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port)}
	d := startController(t, dir, args)
	conn := []string{"--server", fmt.Sprintf("https://127.0.0.1:%d", port), "--data-dir", dir}

	// Without the token, or with a wrong one: refused, exit 1.
	bad := filepath.Join(t.TempDir(), "bad-token")
	os.WriteFile(bad, []byte("not-the-token-0123456789\n"), 0o600)
	if out := ctl(t, append(conn, "--token-file", bad), 1, "apply", "-f", "../../examples/netioc-fig2.yaml"); !strings.Contains(out, "bearer token") {
		t.Fatalf("wrong token: %s", out)
	}

	ctl(t, conn, 0, "apply", "-f", "../../examples/netioc-fig2.yaml")
	start := time.Now()
	out := ctl(t, conn, 0, "set", "vm1/nic0", "reservation=7.5Gbps", "--reason", "seed Fig. 2 step a")
	t.Logf("ctl set (process start, TLS, request): %v", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(out, "vm1/nic0 gets 8.13Gbps on h1/vmnic0") {
		t.Fatalf("set: %s", out)
	}
	events := ctl(t, conn, 0, "get", "events")
	if !strings.Contains(events, "vm1/nic0.reservation=7.5Gbps") || !strings.Contains(events, "seed Fig. 2 step a") {
		t.Fatalf("events: %s", events)
	}
	vms := ctl(t, conn, 0, "get", "vms", "-o", "json")
	if !strings.Contains(vms, `"reservation_bps": 7500000000`) {
		t.Fatalf("vms: %s", vms)
	}
	// A refusal is exit 1 and one line.
	if out := ctl(t, conn, 1, "power-on", "vm1"); strings.Count(out, "\n") != 1 || !strings.Contains(out, "may already run") {
		t.Fatalf("power-on of a running VM: %q", out)
	}
	hosts := ctl(t, conn, 0, "get", "hosts")

	// kill -9, restart on the same data directory: nothing lost.
	d.kill()
	d = startController(t, dir, args)
	if got := ctl(t, conn, 0, "get", "events"); got != events {
		t.Fatalf("events after kill -9 and restart:\n%s\nbefore:\n%s", got, events)
	}
	if got := ctl(t, conn, 0, "get", "vms", "-o", "json"); got != vms {
		t.Fatalf("vms after restart:\n%s\nbefore:\n%s", got, vms)
	}
	if got := ctl(t, conn, 0, "get", "hosts"); got != hosts {
		t.Fatalf("hosts after restart:\n%s\nbefore:\n%s", got, hosts)
	}
	pol := ctl(t, conn, 0, "get", "policy")
	if !strings.Contains(pol, "# then: vm1/nic0.reservation=7.5Gbps") || !strings.Contains(pol, "cluster: fig2") {
		t.Fatalf("policy after restart: %s", pol)
	}
	// The token and certificate of the first start are kept.
	ctl(t, conn, 0, "set", "vm2/nic0", "reservation=4.5Gbps", "--reason", "step b")
	if out := ctl(t, conn, 0, "get", "decisions"); !strings.Contains(out, "vm2") || !strings.Contains(out, "recommended") {
		t.Fatalf("decisions: %s", out)
	}
	d.kill()
}
