package livelab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/lab"
)

// ProcessExit tells whether process pid (not the test's child) has ended,
// and how: "" while it runs, else its termination as the kernel recorded
// it (the exit_code field of /proc/PID/stat while it is a zombie), or
// "gone" once it has been reaped.
func ProcessExit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+2] != 'Z' {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	code, _ := strconv.Atoi(f[len(f)-1])
	if sig := syscall.Signal(code & 0x7f); sig != 0 {
		return "killed by " + sigName(sig)
	}
	return fmt.Sprintf("exited with status %d", code>>8)
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	}
	return fmt.Sprintf("signal %d", int(s))
}

// KillPID sends SIGKILL to pid (a process of the lab) and waits until it
// is gone, or a zombie whose threads have all exited (a killed process's
// leader is a zombie while its other threads, which still hold its
// sockets, exit).
func KillPID(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if ProcessExit(pid) != "" && len(tasks) <= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still there 5 s after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling another process's exit
	}
}

// WaitListening polls until a TCP port listens in network namespace ns
// ("" for the test's own).
func WaitListening(ns string, port int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		args := []string{"ss", "-Hltn"}
		if ns != "" {
			args = append([]string{"ip", "netns", "exec", ns}, args...)
		}
		out, _ := exec.Command(args[0], args[1:]...).Output()
		if bytes.Contains(out, []byte(":"+strconv.Itoa(port)+" ")) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on port %d in %q after %s", port, ns, within)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
	}
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
	if err := WaitListening(pr.Namespace, lab.NBDPort, time.Until(deadline)); err != nil {
		t.Fatalf("restarted nbdkit: %v", err)
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

// nbdkitAbort is how Debian 12's nbdkit 1.32 ends when a client vanishes
// with requests in flight on a connection with more than one thread (it
// logs, with -v, "connections.c:402: raw_send_socket: Assertion `sock >=
// 0' failed"): a gateway killed with SIGKILL sometimes takes the lab's
// datastore down with it.
const nbdkitAbort = "killed by SIGABRT"

// RestartGateway starts a gateway killed with SIGKILL again, as a
// supervisor would (start starts it and returns a channel closed when it
// exits), and waits until it accepts (accepting, which gives up when that
// channel closes). If the lab's datastore *ds died of nbdkit's abort
// meanwhile, that is logged, the datastore started again (*ds updated)
// and, if the gateway found no datastore and exited, the gateway too. A
// datastore that ended any other way fails the test. The error is the
// gateway's, nil once it accepts.
func RestartGateway(t testing.TB, ds *lab.Process, start func() <-chan struct{}, accepting func(exited <-chan struct{}) error) error {
	t.Helper()
	err := accepting(start())
	switch why := ProcessExit(ds.PID); why {
	case "":
	case nbdkitAbort:
		t.Logf("the datastore (nbdkit, pid %d) ended when the gateway was killed (%s, nbdkit 1.32's known abort); started again", ds.PID, why)
		*ds = RestartDatastore(t, *ds)
		if err != nil { // the restarted gateway found no datastore and exited
			err = accepting(start())
		}
	default:
		t.Fatalf("the datastore (nbdkit, pid %d) ended when the gateway was killed (%s), not by nbdkit's known abort", ds.PID, why)
	}
	return err
}
