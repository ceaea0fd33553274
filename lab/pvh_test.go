package lab

import (
	"os"
	"strings"
	"testing"
)

// The host's Debian kernel (scripts/deps.sh installs linux-image-amd64)
// has a PVH entry: GuestKernel returns its uncompressed copy, which is an
// ELF with the Xen PHYS32_ENTRY note; a second call reuses it.
func TestGuestKernelPVH(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("needs root: the copy goes to %s", KernelCacheDir)
	}
	k, _, err := GuestKernel()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(k, KernelCacheDir+"/") {
		_, perr := pvhKernel(k)
		t.Fatalf("GuestKernel returned %s, not a PVH copy in %s: %v", k, KernelCacheDir, perr)
	}
	if err := checkPVH(k); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(k)
	k2, _, err := GuestKernel()
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
