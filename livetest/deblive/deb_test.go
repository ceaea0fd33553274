// Package deblive tests the Debian package of sluice on this machine
// (root, dpkg): `make deb` builds it, dpkg installs, upgrades and purges
// it for real. It fails (not skips) without root or dpkg-deb, and refuses
// to run where a sluice is installed already (it would replace it).
package deblive

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the module's directory (the Makefile's).
func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestDebInstallUpgradePurge: `make deb` builds a package that dpkg -i
// installs (the binary runs and prints its version, bash completion is in
// place, systemd-analyze verify accepts the installed units); a newer package upgrades it and
// keeps the operator's edit of /etc/default/sluice-agent; dpkg --purge
// leaves none of the files it installed, the flags files included.
func TestDebInstallUpgradePurge(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the package test needs root (dpkg -i)")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the package test needs %s", tool)
		}
	}
	if exec.Command("dpkg", "-s", "sluice").Run() == nil {
		t.Fatal("a sluice package is installed on this machine; the test installs and purges its own: remove it first")
	}
	for _, f := range []string{"/usr/bin/sluice", "/usr/lib/systemd/system/sluice-agent.service", "/etc/default/sluice-agent"} {
		if _, err := os.Lstat(f); err == nil {
			t.Fatalf("%s exists (a make install?); the test would replace it: remove it first", f)
		}
	}
	root := repoRoot(t)
	out := run(t, "make", "-C", root, "--no-print-directory", "deb")
	m := regexp.MustCompile(`(?m)^(out/sluice_\S+\.deb)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("make deb printed no package:\n%s", out)
	}
	deb := filepath.Join(root, m[1])
	t.Cleanup(func() {
		if exec.Command("dpkg", "-s", "sluice").Run() == nil {
			_ = exec.Command("dpkg", "--purge", "sluice").Run()
		}
	})

	run(t, "dpkg", "-i", deb)
	if s := run(t, "dpkg-query", "-W", "-f", "${Status} ${Version}", "sluice"); !strings.HasPrefix(s, "install ok installed ") {
		t.Fatalf("after dpkg -i: %s", s)
	}
	if v := run(t, "/usr/bin/sluice", "version"); !strings.HasPrefix(v, "sluice ") {
		t.Errorf("sluice version: %q", v)
	}
	if b, err := os.ReadFile("/usr/share/bash-completion/completions/sluice"); err != nil || !strings.Contains(string(b), "complete -o filenames -F _sluice sluice") {
		t.Errorf("bash completion: %v", err)
	}
	units := []string{"sluice-agent.service", "sluice-gateway.service", "sluice-controller.service"}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		var paths []string
		for _, u := range units {
			paths = append(paths, "/usr/lib/systemd/system/"+u)
		}
		if out, err := exec.Command("systemd-analyze", append([]string{"verify"}, paths...)...).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify of the installed units: %v\n%s", err, out)
		}
	}
	files := strings.Fields(run(t, "dpkg", "-L", "sluice"))

	// The upgrade: the same files as a newer version; the operator's
	// flags are kept.
	const edit = "SLUICE_AGENT_ARGS=\"--host test-upgrade\"\n"
	f, err := os.OpenFile("/etc/default/sluice-agent", os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(edit); err != nil {
		t.Fatal(err)
	}
	f.Close()
	stage := t.TempDir()
	run(t, "dpkg-deb", "-R", deb, stage)
	control, err := os.ReadFile(filepath.Join(stage, "DEBIAN/control"))
	if err != nil {
		t.Fatal(err)
	}
	v1 := regexp.MustCompile(`(?m)^Version: (\S+)$`).FindSubmatch(control)[1]
	v2 := string(v1) + "+1"
	if err := os.WriteFile(filepath.Join(stage, "DEBIAN/control"), []byte(strings.Replace(string(control), "Version: "+string(v1), "Version: "+v2, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	deb2 := filepath.Join(t.TempDir(), "sluice-upgrade.deb")
	run(t, "dpkg-deb", "--root-owner-group", "-Zgzip", "--build", stage, deb2) // as make deb: xz would cost about as much CPU as the rest of the test
	run(t, "dpkg", "-i", deb2)
	if s := run(t, "dpkg-query", "-W", "-f", "${Status} ${Version}", "sluice"); s != "install ok installed "+v2 {
		t.Errorf("after the upgrade: %q, want version %s", s, v2)
	}
	if b, err := os.ReadFile("/etc/default/sluice-agent"); err != nil || !strings.HasSuffix(string(b), edit) {
		t.Errorf("the upgrade lost the operator's flags: %v %q", err, b)
	}

	run(t, "dpkg", "--purge", "sluice")
	if exec.Command("dpkg", "-s", "sluice").Run() == nil {
		t.Error("dpkg -s sluice still finds the package after --purge")
	}
	var left []string
	for _, p := range files {
		st, err := os.Lstat(p)
		if err == nil && !st.IsDir() {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		t.Errorf("dpkg --purge left %s", strings.Join(left, " "))
	}
	t.Logf("installed, upgraded %s → %s and purged: %d paths, none left", v1, v2, len(files))
}
