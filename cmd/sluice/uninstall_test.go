package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sluice/agent"
)

// TestAgentUninstallWithoutRecord (root): where sluice's HTB is an
// uplink's root but neither the state file (--state-dir) nor the roots
// directory records what it replaced, `sluice agent uninstall` says so in
// one line and exits 1, and the HTB stays; with --kernel-default it
// deletes it and the kernel's default comes back. With the agent's config
// file (/etc/sluice/agent.yaml) uninstall needs no flag: it finds the
// agent's host, policy and state directory there, and the record.
func TestAgentUninstallWithoutRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (a network namespace)")
	}
	cluster := fmt.Sprintf("unx%d", os.Getpid()%10000)
	ns := "sl-" + cluster + "-h1"
	sh := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	_ = exec.Command("ip", "netns", "del", ns).Run()
	sh("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh("ip", "-n", ns, "link", "add", "sl-up0", "type", "veth", "peer", "name", "sl-up0p")
	sh("ip", "-n", ns, "link", "set", "sl-up0", "up")
	sh("tc", "-n", ns, "qdisc", "add", "dev", "sl-up0", "root", "handle", "1:", "htb", "default", "10")
	dir := t.TempDir()
	old := configDir
	configDir = t.TempDir()
	defer func() { configDir = old }()
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte("cluster: "+cluster+"\nhosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]\nvms: [{name: vm1, host: h1, nics: [{name: nic0}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"agent", "uninstall", "--host", "h1", "--policy", file, "--state-dir", dir}, &stdout, &stderr)
	want := "sluice agent uninstall: uplink sl-up0: the root qdisc sluice replaced is recorded neither in the state file nor in the roots directory (no state file " +
		filepath.Join(dir, "agent-"+cluster+"-h1.state.json") + ", nothing in /run/sluice/roots): pass the agent's --state-dir, or --kernel-default to let the kernel attach its default root\n"
	if code != exitBad || stderr.String() != want {
		t.Errorf("without a record: exit %d\nstdout %q\nstderr %q\nwant   %q", code, stdout.String(), stderr.String(), want)
	}
	if q := sh("tc", "-n", ns, "qdisc", "show", "dev", "sl-up0", "root"); !strings.Contains(q, "htb 1:") {
		t.Errorf("the failed uninstall changed the root: %s", q)
	}
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"agent", "uninstall", "--host", "h1", "--policy", file, "--state-dir", dir, "--kernel-default"}, &stdout, &stderr)
	if code != exitOK || !strings.Contains(stdout.String(), "sl-up0: root qdisc noqueue 0:0 (the kernel's default) restored") {
		t.Errorf("--kernel-default: exit %d\nstdout %q\nstderr %q", code, stdout.String(), stderr.String())
	}
	if q := sh("tc", "-n", ns, "qdisc", "show", "dev", "sl-up0", "root"); !strings.Contains(q, "noqueue") {
		t.Errorf("after --kernel-default the root is %s", q)
	}

	// The agent's config file, the agent's own flags in it too.
	state := t.TempDir()
	rec := &agent.Record{Uplinks: map[string]agent.Qdisc{"sl-up0": {Kind: "noqueue", Handle: "0:0", Default: true}}}
	if err := agent.WriteRecord(agent.RecordPath(state, cluster, "h1"), rec); err != nil {
		t.Fatal(err)
	}
	cfg := "host: h1\npolicy: " + file + "\nstate-dir: " + state + "\ncpu: true\ninterval: 100ms\nmetrics-listen: \"\"\n"
	if err := os.WriteFile(filepath.Join(configDir, "agent.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	sh("tc", "-n", ns, "qdisc", "add", "dev", "sl-up0", "root", "handle", "1:", "htb", "default", "10")
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"agent", "uninstall"}, &stdout, &stderr)
	if code != exitOK || !strings.Contains(stdout.String(), "sl-up0: root qdisc noqueue 0:0 (the kernel's default) restored") {
		t.Errorf("uninstall with the agent's config file: exit %d\nstdout %q\nstderr %q", code, stdout.String(), stderr.String())
	}
	if _, err := os.Stat(agent.RecordPath(state, cluster, "h1")); !os.IsNotExist(err) {
		t.Errorf("the state file is still there: %v", err)
	}
}
