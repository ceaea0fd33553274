package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentInventoryFlags: the libvirt inventory needs a device for every
// uplink of the host, and names the flag to give; an unknown inventory is
// a usage error.
func TestAgentInventoryFlags(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(f, []byte("cluster: c\nhosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"agent", "--host", "h1", "--policy", f, "--inventory", "vmware"}, exitUsage, "usage: sluice agent"},
		{[]string{"agent", "--host", "h1", "--policy", f, "--inventory", "libvirt", "--once", "--state-dir", dir}, exitBad, "give --uplink up0=DEVICE"},
		{[]string{"agent", "--host", "h1", "--policy", f, "--inventory", "libvirt", "--uplink", "up0", "--once"}, exitUsage, "want NAME=DEVICE"},
		{[]string{"agent", "--host", "h1", "--policy", f, "--inventory", "libvirt", "--uplink", "up0=sl-none0", "--libvirt-socket", filepath.Join(dir, "nosock"), "--once", "--state-dir", dir},
			exitBad, "libvirt connect"},
		{[]string{"agent", "uninstall", "--host", "h1", "--policy", f, "--inventory", "bogus"}, exitUsage, "usage: sluice agent"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args[4:], code, errb.String(), c.code, c.want)
		}
	}
}
