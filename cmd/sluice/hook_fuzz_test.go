package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzHookQemu: whatever the domain's name and XML, the hook's decision
// (here the policy file's, the agent not answering) exits 0 or 1 without
// a panic, says at most one line on stderr, and never admits a domain
// named like a VM whose reservations do not fit (mid: 200 Mbps with 150
// free while big runs).
func FuzzHookQemu(f *testing.F) {
	dir := f.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(hookPolicy), 0o644); err != nil {
		f.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		f.Fatal(err)
	}
	status := `<domstatus state='running' pid='1'><domain type='qemu' id='1'><name>big</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain></domstatus>`
	if err := os.WriteFile(filepath.Join(runDir, "big.xml"), []byte(status), 0o600); err != nil {
		f.Fatal(err)
	}
	noAgent := filepath.Join(dir, "no-agent.sock")
	f.Add("mid", []byte("<domain type='qemu'><name>mid</name><uuid>aaaaaaaa-2222-3333-4444-555555555555</uuid></domain>"))
	f.Add("mid", []byte("<domain"))
	f.Add("stranger", []byte("<domain type='qemu'><name>x</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain>"))
	f.Add("--host=h9", []byte("<domain type='qemu'><name>--host=h9</name></domain>"))
	f.Add("a\nb", []byte("<domain type='qemu'><interface type='network'/><interface type='hostdev'/></domain>"))
	f.Add("", []byte(""))
	f.Fuzz(func(t *testing.T, name string, xml []byte) {
		var errb bytes.Buffer
		code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", noAgent, "--", name, "prepare", "begin", "-"},
			bytes.NewReader(xml), &errb, runDir)
		if code != exitOK && code != exitBad {
			t.Fatalf("name %q: exit %d, want 0 or 1; stderr %q", name, code, errb.String())
		}
		if n := strings.Count(strings.TrimSuffix(errb.String(), "\n"), "\n"); n > 0 {
			t.Fatalf("name %q: %d lines on stderr, want at most one: %q", name, n+1, errb.String())
		}
		if name == "mid" && code == exitOK {
			t.Fatalf("mid admitted (its 200 Mbps do not fit beside big); xml %q, stderr %q", xml, errb.String())
		}
	})
}
