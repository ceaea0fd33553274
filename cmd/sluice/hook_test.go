package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/admit"
	"sluice/agent"
	"sluice/policy"
)

const hookPolicy = `cluster: c
hosts: [{name: h1, cpu: {cores: 4, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}]
vms:
  - {name: big, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 600Mbps}]}
  - {name: mid, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 200Mbps}]}
`

// TestHookQemu: without an agent answering, the hook decides from the
// policy file on prepare begin only, reads the running domains from
// libvirt's status files, prints the reason of a refusal in one line and
// exits 1; when neither the agent nor the file can decide it fails closed
// (--unreachable open admits).
func TestHookQemu(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(hookPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	_ = os.Mkdir(runDir, 0o755)
	status := `<domstatus state='running' pid='1'><domain type='qemu' id='1'><name>big</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain></domstatus>`
	if err := os.WriteFile(filepath.Join(runDir, "big.xml"), []byte(status), 0o600); err != nil {
		t.Fatal(err)
	}
	noAgent := filepath.Join(dir, "no-agent.sock")
	fallback := "the agent at " + noAgent + " does not answer"
	xml := "<domain type='qemu'><name>mid</name><uuid>aaaaaaaa-2222-3333-4444-555555555555</uuid></domain>"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "--", "mid", "prepare", "begin", "-"}, exitBad,
			"sluice: refused mid: its reservations do not fit on h1 with the 1 VMs that run there: network: needs 200Mbps of vNIC reservations, free 150Mbps (short 50Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)]) (" + fallback},
		{[]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "mid", "start", "begin", "-"}, exitOK, ""},
		{[]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "big", "prepare", "begin", "-"}, exitOK, fallback},
		{[]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "stranger", "prepare", "begin", "-"}, exitOK, fallback},
		{[]string{"--policy", filepath.Join(dir, "none.yaml"), "--host", "h1", "--agent", noAgent, "mid", "prepare", "begin", "-"}, exitBad, "and the hook fails closed"},
		{[]string{"--host", "h1", "--agent", noAgent, "mid", "prepare", "begin", "-"}, exitBad, "no policy file is given, and the hook fails closed"},
		{[]string{"--host", "h1", "--agent", noAgent, "--unreachable", "open", "mid", "prepare", "begin", "-"}, exitOK, "starts without an admission check (--unreachable open)"},
		// A domain named like a flag is a domain, after "--".
		{[]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "--", "--host=h9", "prepare", "begin", "-"}, exitOK, fallback},
		{[]string{"--policy", pf, "mid", "prepare", "begin", "-"}, exitUsage, "usage: sluice hook"},
		{[]string{"--host", "h1", "--unreachable", "maybe", "mid", "prepare", "begin", "-"}, exitUsage, "usage: sluice hook"},
	} {
		var errb bytes.Buffer
		code := runHookQemu(c.args, strings.NewReader(xml), &errb, runDir)
		if code != c.code || !strings.Contains(errb.String(), c.want) || (c.want == "" && errb.Len() > 0) {
			t.Errorf("%v: exit %d stderr %q; want %d %q", c.args, code, errb.String(), c.code, c.want)
		}
	}
	// XML the hook cannot read is refused (closed), with the reason.
	var errb bytes.Buffer
	if code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "mid", "prepare", "begin", "-"}, strings.NewReader("<domain"), &errb, runDir); code != exitBad || !strings.Contains(errb.String(), "the domain XML does not parse") {
		t.Errorf("malformed XML: exit %d %q", code, errb.String())
	}
}

// TestHookAsksAgent: with the host's agent answering on its admission
// socket, the agent decides, by the policy it enforces (here the
// controller's: mid reserves 300 Mbps there, 200 in the file) and the
// VMs the controller starts on the host.
func TestHookAsksAgent(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(hookPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	inForce, err := policy.Parse("controller", []byte(strings.Replace(hookPolicy, "reservation: 200Mbps", "reservation: 300Mbps", 1)))
	if err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	_ = os.Mkdir(runDir, 0o755)
	adm := &agent.Admitter{Host: "h1", Running: func() ([]admit.Domain, error) { return runningDomains(runDir) }}
	adm.Set(inForce, []string{"big"}) // big was powered on here and does not run yet
	sock := filepath.Join(dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- adm.ServeAdmit(ctx, sock) }()
	t.Cleanup(func() { cancel(); <-served })
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("admission socket mode %v, want 0600", fi.Mode().Perm())
			}
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the server's socket, with the test's deadline
	}
	xml := "<domain type='qemu'><name>mid</name></domain>"
	var errb bytes.Buffer
	code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", sock, "--", "mid", "prepare", "begin", "-"}, strings.NewReader(xml), &errb, runDir)
	want := "sluice: refused mid: its reservations do not fit on h1 with the 1 VMs that run there: network: needs 300Mbps of vNIC reservations, free 150Mbps (short 150Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)])\n"
	if code != exitBad || errb.String() != want {
		t.Errorf("mid next to big (starting): exit %d %q, want %d %q", code, errb.String(), exitBad, want)
	}
	// big no longer starts here: mid fits.
	adm.Set(inForce, nil)
	errb.Reset()
	if code := runHookQemu([]string{"--host", "h1", "--agent", sock, "mid", "prepare", "begin", "-"}, strings.NewReader(xml), &errb, runDir); code != exitOK || errb.Len() > 0 {
		t.Errorf("mid alone: exit %d %q", code, errb.String())
	}
}

// TestHookQemuUnnamed: with an unnamedVMs reservation the hook counts the
// interfaces of a starting domain the policy does not name (from its XML on
// stdin) and of running ones (from their status files).
func TestHookQemuUnnamed(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(hookPolicy+"unnamedVMs: {reservation: 100Mbps}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	_ = os.Mkdir(runDir, 0o755)
	status := `<domstatus state='running' pid='1'><domain type='qemu' id='1'><name>other</name><devices>` +
		`<interface type='bridge'><target dev='vnet0'/></interface><interface type='hostdev'/></devices></domain></domstatus>`
	if err := os.WriteFile(filepath.Join(runDir, "other.xml"), []byte(status), 0o600); err != nil {
		t.Fatal(err)
	}
	xml := "<domain type='qemu'><name>web7</name><devices><interface type='bridge'/><interface type='network'/></devices></domain>"
	var errb bytes.Buffer
	// 100 (other's one vNIC) + 2 × 100 fit the 750Mbps budget.
	if code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", filepath.Join(dir, "none.sock"), "web7", "prepare", "begin", "-"}, strings.NewReader(xml), &errb, runDir); code != exitOK {
		t.Fatalf("web7 with 2 vNICs next to other: exit %d %s", code, errb.String())
	}
	// big's 600 + other's 100 + 2 × 100 do not.
	big := `<domstatus state='running' pid='2'><domain type='qemu' id='2'><name>big</name></domain></domstatus>`
	if err := os.WriteFile(filepath.Join(runDir, "big.xml"), []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", filepath.Join(dir, "none.sock"), "web7", "prepare", "begin", "-"}, strings.NewReader(xml), &errb, runDir)
	got, _, _ := strings.Cut(errb.String(), " (the agent at ") // the line ends with the file's note
	errb.Reset()
	errb.WriteString(got + "\n")
	want := "sluice: refused web7: its reservations (unnamedVMs: 100Mbps per vNIC, 2 vNICs) do not fit on h1 with the 2 VMs that run there: network: needs 200Mbps of vNIC reservations, free 50Mbps (short 150Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)])\n"
	if code != exitBad || errb.String() != want {
		t.Errorf("web7 next to big and other: exit %d %q, want %d %q", code, errb.String(), exitBad, want)
	}
}

// TestHookInstall: install keeps an existing hook and chains it (run after
// sluice admits, not when it refuses, with the domain XML on its stdin);
// installing again replaces only sluice's; uninstall puts the old one
// back; a second uninstall finds nothing.
func TestHookInstall(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(hookPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	hooks := filepath.Join(dir, "hooks")
	_ = os.Mkdir(hooks, 0o755)
	log := filepath.Join(dir, "log")
	old := "#!/bin/sh\necho \"old $* $(cat | head -c 8)\" >> " + log + "\n"
	if err := os.WriteFile(filepath.Join(hooks, "qemu"), []byte(old), 0o755); err != nil {
		t.Fatal(err)
	}
	// A stand-in for sluice: refuses the domain "bad".
	stub := filepath.Join(dir, "sluice")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\ncat >/dev/null\n[ \"${12}\" = bad ] && { echo 'sluice: refused bad' >&2; exit 1; }\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	install := []string{"hook", "install", "--policy", pf, "--host", "h1", "--hooks-dir", hooks, "--sluice", stub, "--no-reload"}
	for i := 0; i < 2; i++ {
		var out, errb bytes.Buffer
		if code := run(install, &out, &errb); code != exitOK {
			t.Fatalf("install: %d %s", code, errb.String())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(hooks, "qemu.sluice-chained")); string(b) != old {
		t.Fatalf("the old hook was not kept: %q", b)
	}
	hook := func(args ...string) (int, string) {
		cmd := exec.Command(filepath.Join(hooks, "qemu"), args...)
		cmd.Stdin = strings.NewReader("<domain>...</domain>")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), errb.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, errb.String()
	}
	if code, e := hook("bad", "prepare", "begin", "-"); code == 0 || !strings.Contains(e, "refused bad") {
		t.Errorf("hook for bad: exit %d stderr %q", code, e)
	}
	if code, _ := hook("good", "prepare", "begin", "-"); code != 0 {
		t.Errorf("hook for good: exit %d", code)
	}
	if code, _ := hook("good", "release", "end", "-"); code != 0 {
		t.Errorf("hook release: exit %d", code)
	}
	if b, _ := os.ReadFile(log); string(b) != "old good prepare begin - <domain>\nold good release end - <domain>\n" {
		t.Errorf("the chained hook saw %q", b)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"hook", "uninstall", "--hooks-dir", hooks, "--no-reload"}, &out, &errb); code != exitOK {
		t.Fatalf("uninstall: %d %s", code, errb.String())
	}
	if b, _ := os.ReadFile(filepath.Join(hooks, "qemu")); string(b) != old {
		t.Errorf("uninstall did not restore the old hook: %q", b)
	}
	if _, err := os.Stat(filepath.Join(hooks, "qemu.sluice-chained")); err == nil {
		t.Error("the chained copy is left")
	}
	out.Reset()
	if code := run([]string{"hook", "uninstall", "--hooks-dir", hooks, "--no-reload"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "nothing to remove") {
		t.Errorf("second uninstall: %d %q", code, out.String())
	}
}
