package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestNoForwarding (root): forwarding goes off in a namespace of the
// lab's, and no thread of this process stays in it, however often it
// runs (a main thread left there would make Down kill this process).
func TestNoForwarding(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestNoForwarding needs root (network namespaces); run it as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip not found: scripts/deps.sh installs iproute2")
	}
	ns := fmt.Sprintf("sl-nofwd%d-probe", os.Getpid())
	if err := ip("netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", ns) })
	before := threadNetns(t)
	if len(before) != 1 {
		t.Fatalf("threads in %d namespaces before the test", len(before))
	}
	for range 50 {
		if err := noForwarding(ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range forwardingSysctls {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", f).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Errorf("%s in %s: %q (%v), want 0", f, ns, out, err)
		}
	}
	for ino := range threadNetns(t) {
		if !before[ino] {
			t.Errorf("a thread of this process is in another namespace (inode %d) after noForwarding", ino)
		}
	}
}

// threadNetns is the set of the network namespaces (inodes) this
// process's threads are in.
func threadNetns(t *testing.T) map[uint64]bool {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads: %v", err)
	}
	out := map[uint64]bool{}
	for _, p := range tasks {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err == nil { // a thread may have ended
			out[st.Ino] = true
		}
	}
	return out
}
