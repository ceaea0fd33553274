package virtlive

import (
	"testing"

	"sluice/lab"
)

// The guests of these tests boot the host's kernel with the lab's
// initramfs (lab.WriteInitramfs): the host's filesystem over 9p as their
// root, lab.GuestScript as their init.

// guestKernel finds the host's Debian kernel and its modules directory; the
// test fails with the reason when either is missing.
func guestKernel(t *testing.T) (vmlinuz, modDir string) {
	t.Helper()
	k, m, err := lab.GuestKernel()
	if err != nil {
		t.Fatal(err)
	}
	return k, m
}

// writeInitramfs writes the guest's initramfs.
func writeInitramfs(path, modDir string) error { return lab.WriteInitramfs(path, modDir) }
