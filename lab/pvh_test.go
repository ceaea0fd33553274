package lab

import (
	"os"
	"path/filepath"
	"testing"
)

// The host's Debian kernel (scripts/deps.sh installs linux-image-amd64)
// has a PVH entry: pvhKernel makes its uncompressed copy, an ELF with the
// Xen PHYS32_ENTRY note, and a second call reuses it. The copy goes to a
// directory of the test's own, not KernelCacheDir, which the package
// test's purge (livetest/deblive) removes while this package may run.
func TestPVHKernel(t *testing.T) {
	vmlinuz, _, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cache")
	k, err := pvhKernel(vmlinuz, dir)
	if err != nil {
		t.Fatalf("no PVH copy of %s: %v", vmlinuz, err)
	}
	if filepath.Dir(k) != dir {
		t.Fatalf("pvhKernel returned %s, not a copy in %s", k, dir)
	}
	if err := checkPVH(k); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(k)
	k2, err := pvhKernel(vmlinuz, dir)
	after, _ := os.Stat(k2)
	if err != nil || k2 != k || !os.SameFile(before, after) {
		t.Errorf("second call: %s (%v), want the same file %s", k2, err, k)
	}
	if err := hasPVHEntry([]byte("not an elf")); err == nil {
		t.Error("hasPVHEntry accepted a non-ELF")
	}
	self, _ := os.ReadFile("/proc/self/exe")
	if err := hasPVHEntry(self); err == nil {
		t.Error("hasPVHEntry accepted the test binary (no Xen note)")
	}
}
