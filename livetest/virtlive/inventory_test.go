// Package virtlive tests the libvirt inventory against a real libvirtd with
// real QEMU (TCG) guests. It needs root and what scripts/deps.sh installs;
// a missing piece fails the test with its reason. Everything a run creates
// carries its ID: the domain sl-virtlive-ID, the bridge sl-vlbrID, the files
// in $TMPDIR/sl-virtlive-ID-…; all are removed when the test ends, also
// when it fails, and a guest powers itself off after 3 minutes (sl.ttl).
package virtlive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/virt"
)

// preflight fails the test with the first missing capability.
func preflight(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("virtlive needs root (libvirtd's socket, bridges)")
	}
	if _, err := os.Stat(virt.DefaultSocket); err != nil {
		t.Fatalf("libvirtd is not running (%v): run scripts/deps.sh, which installs and starts it", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip (iproute2) not found: run scripts/deps.sh")
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// sweep removes what an earlier run that was killed left behind: each run
// keeps its files in sl-virtlive-ID-*, created before its domain
// sl-virtlive-ID and bridge sl-vlbrID; a directory older than a run can
// last marks leftovers (a younger one may be another run's, left alone).
func sweep(t *testing.T, c *libvirt.Libvirt) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sl-virtlive-*-*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || time.Since(fi.ModTime()) < 5*time.Minute {
			continue
		}
		id := strings.Split(strings.TrimPrefix(filepath.Base(d), "sl-virtlive-"), "-")[0]
		for _, name := range []string{"sl-virtlive-" + id, "sl-virtlive-" + id + "-a", "sl-virtlive-" + id + "-b"} {
			if dom, err := c.DomainLookupByName(name); err == nil {
				t.Logf("sweep: destroying leftover domain %s", name)
				c.DomainDestroy(dom)
			}
		}
		exec.Command("ip", "link", "del", "sl-vlbr"+id).Run()
		exec.Command("ip", "link", "del", "sl-vlu"+id).Run()
		exec.Command("ip", "netns", "del", "sl-virtlive-"+id).Run()
		os.RemoveAll(d)
	}
}

func domainXML(name, kernel, initrd, bridge, mac, console string) string {
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 sl.ttl=180</cmdline>
  </os>
  <cpu mode='maximum' check='none'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <filesystem type='mount' accessmode='passthrough' multidevs='remap'>
      <source dir='/'/>
      <target dir='hostroot'/>
      <readonly/>
    </filesystem>
    <interface type='bridge'>
      <source bridge='%s'/>
      <mac address='%s'/>
      <model type='virtio'/>
      <alias name='ua-nic0'/>
    </interface>
    <serial type='file'>
      <source path='%s'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>`, name, kernel, initrd, bridge, mac, console)
}

// TestInventoryFollowsDomain starts a TCG guest on a test bridge under the
// real libvirtd while the inventory runs, and checks that the inventory
// shows its tap (on that bridge, by the kernel's own account) and MAC
// within 1 s of libvirt's start event, and forgets it within 1 s of the
// stop event after destroy.
func TestInventoryFollowsDomain(t *testing.T) {
	preflight(t)
	ctl, err := virt.Dial("")
	if err != nil {
		t.Fatalf("%v (is libvirtd running? scripts/deps.sh starts it)", err)
	}
	t.Cleanup(func() { ctl.Close() })
	c := ctl.Client()
	sweep(t, c)

	id := randHex(2)
	name, bridge := "sl-virtlive-"+id, "sl-vlbr"+id
	mac := "52:54:00:5e:" + id[:2] + ":" + id[2:]
	dir, err := os.MkdirTemp("", "sl-virtlive-"+id+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kernel, modDir := guestKernel(t)
	initrd := filepath.Join(dir, "initrd")
	if err := writeInitramfs(initrd, modDir); err != nil {
		t.Fatalf("guest initramfs: %v", err)
	}
	run(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	run(t, "ip", "link", "set", bridge, "up")

	// The inventory, on its own connection, as the agent runs it.
	conn, err := virt.Dial("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	inv := virt.New(conn, virt.Config{Cgroup: virt.ProcCgroup})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- inv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("inventory Run: %v", err)
		}
	})

	// The test's own view of the events, to time the inventory against.
	evs, err := c.LifecycleEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventAt := func(want libvirt.DomainEventType) time.Time {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case ev, ok := <-evs:
				if !ok {
					t.Fatal("libvirt event stream closed")
				}
				if ev.Dom.Name == name && libvirt.DomainEventType(ev.Event) == want {
					return time.Now()
				}
			case <-deadline:
				t.Fatalf("no lifecycle event %d for %s within 30 s", want, name)
			}
		}
	}
	// seen waits for cond on each inventory change; it returns when cond
	// first held.
	seen := func(what string, cond func() bool) time.Time {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !cond() {
			select {
			case <-inv.Changes():
			case <-deadline:
				t.Fatalf("%s: not seen within 10 s (last error: %v); domains: %+v", what, inv.LastErr(), inv.Domains())
			}
		}
		return time.Now()
	}

	console := filepath.Join(dir, "console.log")
	t0 := time.Now()
	dom, err := c.DomainCreateXML(domainXML(name, kernel, initrd, bridge, mac, console), 0)
	if err != nil {
		t.Fatalf("DomainCreateXML: %v", err)
	}
	t.Cleanup(func() {
		if d, err := c.DomainLookupByName(name); err == nil {
			c.DomainDestroy(d)
		}
	})
	started := eventAt(libvirt.DomainEventStarted)
	var v virt.VNIC
	at := seen("the domain's vNIC", func() bool {
		var ok bool
		v, ok = inv.Port(name + "/nic0")
		return ok
	})
	t.Logf("create returned after %v; start event; inventory had the vNIC %v after the event (%s, %s on %s, index %d)",
		started.Sub(t0).Round(time.Millisecond), at.Sub(started).Round(100*time.Microsecond), v.Dev, v.MAC, v.Bridge, v.Index)
	if d := at.Sub(started); d > time.Second {
		t.Errorf("inventory saw the domain %v after its start event, want ≤ 1 s", d)
	}
	if v.MAC != mac || v.Bridge != bridge || v.Dev == "" {
		t.Errorf("vNIC = %+v, want MAC %s on bridge %s with a tap", v, mac, bridge)
	}
	if master, err := os.Readlink("/sys/class/net/" + v.Dev + "/master"); err != nil || filepath.Base(master) != bridge {
		t.Errorf("tap %s: kernel master %q (%v), want bridge %s", v.Dev, master, err, bridge)
	}
	if vms, _ := inv.VMs(); !contains(vms, name) {
		t.Errorf("VMs() = %v, missing %s", vms, name)
	}
	for _, d := range inv.Domains() {
		if d.Name == name {
			t.Logf("domain %s: uuid %s, %d vCPU, partition %q, cgroup %q", d.Name, d.UUID, d.VCPUs, d.Partition, d.Cgroup)
		}
	}

	// A real guest: it boots the host's kernel and mounts the host's
	// filesystem as its root.
	bootAt, err := waitConsole(console, "sl-guest: root up", 40*time.Second)
	if err != nil {
		t.Fatalf("guest did not boot: %v", err)
	}
	t.Logf("guest up %v after create: %s", bootAt.Sub(t0).Round(time.Millisecond), lastLine(console, "sl-guest: root up"))

	if err := c.DomainDestroy(dom); err != nil {
		t.Fatalf("DomainDestroy: %v", err)
	}
	stopped := eventAt(libvirt.DomainEventStopped)
	gone := seen("the domain gone", func() bool {
		_, ok := inv.Port(name + "/nic0")
		vms, _ := inv.VMs()
		return !ok && !contains(vms, name)
	})
	t.Logf("inventory dropped the domain %v after its stop event", gone.Sub(stopped).Round(100*time.Microsecond))
	if d := gone.Sub(stopped); d > time.Second {
		t.Errorf("inventory dropped the domain %v after its stop event, want ≤ 1 s", d)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// waitConsole polls the guest's serial log for a line (a live check of a
// real guest: no event tells when its console says something).
func waitConsole(path, marker string, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), marker) {
			return time.Now(), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return time.Time{}, fmt.Errorf("no %q on the console within %v; console tail:\n%s", marker, limit, s)
}

func lastLine(path, marker string) string {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, marker) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
