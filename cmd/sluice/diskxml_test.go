package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGatewayDiskXML: `sluice gateway disk-xml` prints the <disk> of a
// VM's disk on its host's gateway, or one line naming what is wrong.
func TestGatewayDiskXML(t *testing.T) {
	tmp := t.TempDir()
	pol := filepath.Join(tmp, "p.yaml")
	if err := os.WriteFile(pol, []byte(`cluster: dx
hosts:
  - {name: h1, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, uplinks: [{name: up0, speed: 1Gbps}]}
datastores: [{name: ds1}]
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: ds1}, {name: d1, datastore: ds1}]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := "--socket-dir=/run/sluice/gw-h1"
	cases := []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"--policy", pol, "--host", "h1", dir, "vm1/d1"}, exitOK,
			"<disk type='network' device='disk'>\n  <driver name='qemu' type='raw'/>\n  <source protocol='nbd' name='vm1/d1'>\n    <host transport='unix' socket='/run/sluice/gw-h1/vm1.sock'/>\n    <reconnect delay='30'/>\n  </source>\n  <target dev='vdb' bus='virtio'/>\n  <serial>d1</serial>\n</disk>\n", ""},
		{[]string{"--policy", pol, "--host", "h1", "--reconnect-delay", "5", "vm1/d0"}, exitOK,
			"<host transport='unix' socket='/run/sluice/gw-dx-h1/vm1.sock'/>\n    <reconnect delay='5'/>", ""},
		{[]string{"--policy", pol, "--host", "h1", dir, "--form", "qemu", "vm1/d0"}, exitOK,
			"<qemu:arg value='virtio-blk-pci,drive=sl-disk24,id=sl-disk24,bus=pci.0,addr=0x18,serial=d0'/>", ""},
		{[]string{"--policy", pol, "--host", "h2", dir, "vm1/d0"}, exitBad, "",
			"sluice gateway disk-xml: VM vm1 is on host \"h1\", not h2: its disks are served by its own host's gateway\n"},
		{[]string{"--policy", pol, "--host", "h1", dir, "vm1/d9"}, exitBad, "", "sluice gateway disk-xml: VM vm1 has no disk \"d9\"\n"},
		{[]string{"--policy", pol, "--host", "h1", dir, "vm9/d0"}, exitBad, "", "sluice gateway disk-xml: no VM \"vm9\" in " + pol + "\n"},
		{[]string{"--policy", pol, "--host", "h9", dir, "vm1/d0"}, exitBad, "", "sluice gateway disk-xml: no host \"h9\" in " + pol + "\n"},
		{[]string{"--policy", pol, "--host", "h1", "--socket-dir", "rel", "vm1/d0"}, exitBad, "",
			"sluice gateway disk-xml: --socket-dir rel: want an absolute path (QEMU opens it)\n"},
		{[]string{"--policy", pol, "--host", "h1", dir, "vm1"}, exitUsage, "", "sluice gateway disk-xml: \"vm1\": want VM/DISK\n"},
		{[]string{"--policy", pol, "--host", "h1", dir, "--reconnect-delay", "-1", "vm1/d0"}, exitUsage, "", "sluice gateway disk-xml: --reconnect-delay must be ≥ 0\n"},
		{[]string{"--policy", pol, "vm1/d0"}, exitUsage, "", diskXMLUsage + "\n"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"gateway", "disk-xml"}, c.args...), &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || stderr.String() != c.errs || (c.stdout == "" && stdout.Len() > 0) {
			t.Errorf("sluice gateway disk-xml %s: exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout containing %q, stderr %q",
				strings.Join(c.args, " "), code, stdout.String(), stderr.String(), c.code, c.stdout, c.errs)
		}
	}
}
