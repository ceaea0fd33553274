package virt

import "testing"

// TestVMCgroup: the inventory gives a running domain's cgroup relative to
// its hierarchy (by name or UUID), and nothing for a domain that stopped
// or whose cgroup is unknown.
func TestVMCgroup(t *testing.T) {
	f := newFake()
	dirs := map[string]string{
		"vm1": `/sys/fs/cgroup/cpu/machine/qemu-1-vm1.libvirt-qemu`,
		"vm2": `/sys/fs/cgroup/machine.slice/machine-qemu\x2d2\x2dvm2.scope`,
		"vm3": "",
	}
	inv := New(f, Config{Cgroup: func(d Domain) string { return dirs[d.Name] }})
	f.start("vm1", "0b6f6b6e-0000-4000-8000-000000000001", nil, EventStarted)
	f.start("vm2", "", nil, EventStarted)
	f.start("vm3", "", nil, EventStarted)
	if err := inv.Refresh(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vm, want string
		ok       bool
	}{
		{"vm1", "machine/qemu-1-vm1.libvirt-qemu", true},
		{"0b6f6b6e-0000-4000-8000-000000000001", "machine/qemu-1-vm1.libvirt-qemu", true},
		{"vm2", `machine.slice/machine-qemu\x2d2\x2dvm2.scope`, true},
		{"vm3", "", false},
		{"vm4", "", false},
	} {
		if g, ok := inv.VMCgroup(c.vm); g != c.want || ok != c.ok {
			t.Errorf("VMCgroup(%s) = %q, %v; want %q, %v", c.vm, g, ok, c.want, c.ok)
		}
	}
	f.stop("vm1", EventStopped)
	if err := inv.Refresh(); err != nil {
		t.Fatal(err)
	}
	if g, ok := inv.VMCgroup("vm1"); ok {
		t.Errorf("vm1 stopped but VMCgroup gives %q", g)
	}
}
