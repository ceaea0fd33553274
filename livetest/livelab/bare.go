package livelab

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/virt"
)

// Libvirt is a connection to this machine's libvirtd for a test that
// starts bare domains of its own (BareDomain), closed when the test
// ends. It fails the test, never skips it, without root, libvirtd or
// one of tools.
func Libvirt(t testing.TB, tools ...string) *virt.Libvirt {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("bare domains need root (libvirtd's socket)")
	}
	if _, err := os.Stat(virt.DefaultSocket); err != nil {
		t.Fatalf("libvirtd is not running (%v): run scripts/deps.sh, which installs and starts it", err)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
	c, err := virt.Dial("")
	if err != nil {
		t.Fatalf("%v: is libvirtd running? scripts/deps.sh starts it", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// BareDomain starts a transient domain name (give it the sl- prefix) of
// one vCPU and memMiB with devices (libvirt XML inside <devices>) and no
// OS: the firmware finds nothing to boot and waits, which is enough for
// QEMU's threads and block layer. It is destroyed when the test ends.
func BareDomain(t testing.TB, c *virt.Libvirt, name string, memMiB int, devices string) {
	t.Helper()
	x := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>%d</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
<on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot><on_crash>destroy</on_crash>
<devices>%s<memballoon model='none'/></devices></domain>`, name, memMiB, devices)
	d, err := c.Client().DomainCreateXML(x, 0)
	if err != nil {
		t.Fatalf("DomainCreateXML %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.Client().DomainDestroy(d); err != nil && !libvirt.IsNotFound(err) {
			t.Errorf("DomainDestroy %s: %v", name, err)
		}
	})
}
