// Package ctllive runs the real `sluice controller` binary and talks to it
// with the real `sluice ctl`: a policy applied, a reservation set, the
// event with its reason, then kill -9 and a restart on the same data
// directory with nothing lost (TestControllerCtl, no root); and seed
// Fig. 2 end to end in a lab with real agents on the controller, iperf3
// throughout, DRS migrating VMs by itself and a kill -9 of the controller
// mid-run (TestFig2DRSLive, root: network namespaces, tc, iperf3).
package ctllive

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/livetest/livelab"
)

var bin string // the sluice binary built for the tests

func TestMain(m *testing.M) { os.Exit(livelab.RunWithSluice(m, &bin)) }

// startController starts the controller on dir and waits for its ready
// line (livelab.StartController).
func startController(t *testing.T, dir string, args []string) *livelab.Controller {
	t.Helper()
	return livelab.StartController(t, bin, dir, args)
}

// ctl runs `sluice ctl` with the connection flags and returns its output,
// failing the test on another exit code than wantCode (livelab.Ctl).
func ctl(t *testing.T, conn []string, wantCode int, args ...string) string {
	t.Helper()
	return livelab.Ctl(t, bin, conn, wantCode, args...)
}

func TestControllerCtl(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	port := livelab.FreePort(t)
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
	d.Kill()
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
	d.Kill()
}
