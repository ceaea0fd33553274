package virt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysfs makes a sysfs tree with PF 0000:03:00.0 (net device
// enp3s0f0) and its VFs 0000:03:10.N as virtfnN, N < vfs, linked as the
// kernel links them (relative links between PCI devices).
func fakeSysfs(t *testing.T, vfs int) string {
	root := t.TempDir()
	devs := filepath.Join(root, "bus", "pci", "devices")
	pf := filepath.Join(devs, "0000:03:00.0")
	if err := os.MkdirAll(filepath.Join(pf, "net", "enp3s0f0"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < vfs; i++ {
		vf := "0000:03:10." + string(rune('0'+i))
		if err := os.MkdirAll(filepath.Join(devs, vf), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../0000:03:00.0", filepath.Join(devs, vf, "physfn")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../"+vf, filepath.Join(pf, "virtfn"+string(rune('0'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	// A device that is no VF.
	if err := os.MkdirAll(filepath.Join(devs, "0000:00:02.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

const sriovDomain = `<domain type='kvm'>
  <name>db</name>
  <uuid>11111111-2222-3333-4444-555555555555</uuid>
  <devices>
    <interface type='bridge'>
      <mac address='52:54:00:00:00:01'/><source bridge='br0'/><target dev='vnet0'/><alias name='ua-nic0'/>
    </interface>
    <interface type='hostdev' managed='yes'>
      <mac address='52:54:00:00:00:02'/>
      <source><address type='pci' domain='0x0000' bus='0x03' slot='0x10' function='0x2'/></source>
      <alias name='ua-vf0'/>
    </interface>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x03' slot='0x10' function='0x1'/></source>
      <alias name='ua-vf1'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x00' slot='0x02' function='0x0'/></source>
      <alias name='ua-gpu'/>
    </hostdev>
  </devices>
</domain>`

// TestVF finds the VF of a hostdev interface and of a <hostdev> through
// a fake sysfs, and reports what cannot be found without failing.
func TestVF(t *testing.T) {
	c := newFake()
	c.running["db"] = sriovDomain
	inv := New(c, Config{Uplinks: map[string]string{"pf0": "enp3s0f0"}, Sysfs: fakeSysfs(t, 4)})
	if err := inv.Refresh(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ port, want string }{
		{"db/vf0", "enp3s0f0 2 0000:03:10.2"},
		{"db/vf1", "enp3s0f0 1 0000:03:10.1"},
		{"11111111-2222-3333-4444-555555555555/vf0", "enp3s0f0 2 0000:03:10.2"},
		{"db/gpu", "error: db/gpu: PCI device 0000:00:02.0 is no SR-IOV virtual function (no physfn)"},
		{"db/nic0", "error: db/nic0: domain db has no interface type='hostdev' nor <hostdev> with alias ua-nic0: no passthrough PCI device"},
		{"other/vf0", "error: other/vf0: domain other does not run: no passthrough PCI device"},
	} {
		vf, err := inv.VF(tc.port)
		got := fmt.Sprintf("%s %d %s", vf.PF, vf.Index, vf.PCI)
		if err != nil {
			got = "error: " + err.Error()
		}
		if got != tc.want {
			t.Errorf("VF(%s) = %q, want %q", tc.port, got, tc.want)
		}
	}
	// A VF its PF does not list (sriov_numvfs lowered meanwhile).
	root := fakeSysfs(t, 4)
	os.Remove(filepath.Join(root, "bus/pci/devices/0000:03:00.0/virtfn2"))
	if _, err := SysfsVF(root, "0000:03:10.2"); err == nil || !strings.Contains(err.Error(), "not among the virtfn links") {
		t.Errorf("SysfsVF without its virtfn link: %v", err)
	}
	if _, err := SysfsVF(root, "0000:09:00.0"); err == nil {
		t.Error("SysfsVF of a missing device: no error")
	}
}
