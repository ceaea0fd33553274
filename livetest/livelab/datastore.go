package livelab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/lab"
)

// DatastoreExit tells whether the lab's datastore process pr (nbdkit)
// has ended, and how: "" while it runs, else its termination as the
// kernel recorded it (the exit_code field of /proc/PID/stat while it is
// a zombie), or "gone" once it has been reaped.
//
// Debian 12's nbdkit 1.32 with more than one thread per connection can
// abort when a client vanishes with requests in flight (it logs, with -v,
// "connections.c:402: raw_send_socket: Assertion `sock >= 0' failed"):
// a gateway killed with SIGKILL sometimes takes the lab's datastore down
// with it. Tests that kill a gateway check for that here.
func DatastoreExit(pr lab.Process) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pr.PID))
	if err != nil {
		return "gone"
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+2] != 'Z' {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	code, _ := strconv.Atoi(f[len(f)-1])
	if sig := code & 0x7f; sig != 0 {
		return fmt.Sprintf("killed by signal %d", sig)
	}
	return fmt.Sprintf("exited with status %d", code>>8)
}

// RestartDatastore starts the recorded nbdkit pr again with the same
// command line (it daemonizes and writes its pid file), as a supervisor
// would, waits until it listens and returns it with its new pid (from
// its pid file). The lab's Down kills it with its namespace's processes.
func RestartDatastore(t testing.TB, pr lab.Process) lab.Process {
	t.Helper()
	// A killed nbdkit's leader thread is a zombie while its other threads
	// exit, and they hold the listening socket a moment longer.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("ip", append([]string{"netns", "exec", pr.Namespace}, pr.Args...)...).CombinedOutput()
		if err == nil {
			break
		}
		if !bytes.Contains(out, []byte("Address already in use")) || time.Now().After(deadline) {
			t.Fatalf("restart nbdkit: %v: %s", err, out)
		}
		time.Sleep(20 * time.Millisecond) // polling the old process's exit, with a deadline
	}
	for {
		o, _ := exec.Command("ip", "netns", "exec", pr.Namespace, "ss", "-Hltn").Output()
		if bytes.Contains(o, []byte(fmt.Sprintf(":%d ", lab.NBDPort))) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdkit in %s not listening 10 s after its restart", pr.Namespace)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
	}
	for i, a := range pr.Args {
		if a == "--pidfile" && i+1 < len(pr.Args) {
			b, err := os.ReadFile(pr.Args[i+1])
			if err != nil {
				t.Fatalf("restarted nbdkit's pid file: %v", err)
			}
			if pr.PID, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				t.Fatalf("restarted nbdkit's pid file %s: %v", pr.Args[i+1], err)
			}
			return pr
		}
	}
	t.Fatalf("nbdkit's command line has no --pidfile: %v", pr.Args)
	return pr
}

// AcceptsOn polls until a server accepts on network address addr; it
// gives up when exited (if not nil) is closed: the process meant to serve
// is gone. (A socket file a killed server left behind exists but refuses.)
func AcceptsOn(network, addr string, within time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout(network, addr, time.Second)
		if err == nil {
			return c.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("it exited before accepting on %s", addr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing accepts on %s after %s: %w", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
	}
}
