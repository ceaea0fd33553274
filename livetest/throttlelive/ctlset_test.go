package throttlelive

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"sluice/livetest/livelab"
)

// TestCtlSetReachesQEMU (issue 26): the real controller and a real
// `sluice agent --controller --inventory libvirt --datastore ds1=DIR` on
// this machine's libvirtd, with a domain whose disk d0 is on a datastore
// with the throttle driver. Each `ctl set VM/d0 limit=N` reaches QEMU
// (the disk's total_iops_sec read back from libvirt) within 1 s of the
// set's start.
func TestCtlSetReachesQEMU(t *testing.T) {
	c := livelab.Libvirt(t, "qemu-img")
	vm := bareDomain(t, c)
	machine := livelab.WatchMachine(t)
	dir := t.TempDir()
	id := livelab.RandHex(2)
	up, peer := "sl-tcu"+id, "sl-tcp"+id
	if out, err := exec.Command("ip", "link", "add", up, "type", "veth", "peer", "name", peer).CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", up).Run() })
	for _, d := range []string{up, peer} {
		if out, err := exec.Command("ip", "link", "set", d, "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s up: %v: %s", d, err, out)
		}
	}
	dsDir := filepath.Join(dir, "ds1")
	if err := os.Mkdir(dsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(dir, "policy.yaml")
	doc := fmt.Sprintf(`cluster: tc%s
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
datastores: [{name: ds1, driver: throttle}]
vms:
  - {name: %s, host: h1, disks: [{name: d0, datastore: ds1, limitIOPS: 120}]}
`, id, vm)
	if err := os.WriteFile(pol, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	server := fmt.Sprintf("https://127.0.0.1:%d", livelab.FreePort(t))
	livelab.StartController(t, sluiceBin, data, []string{"--listen", server[len("https://"):]})
	conn := []string{"--server", server, "--data-dir", data}
	livelab.Ctl(t, sluiceBin, conn, 0, "apply", "-f", pol)
	state := filepath.Join(dir, "state")
	livelab.StartSluice(t, sluiceBin, dir, "agent", syscall.SIGTERM, "agent", "--host", "h1", "--controller", server,
		"--token-file", filepath.Join(data, "token"), "--ca", filepath.Join(data, "tls", "cert.pem"), "--inventory", "libvirt",
		"--uplink", "up0="+up, "--datastore", "ds1="+dsDir, "--state-dir", state)
	t.Cleanup(func() {
		exec.Command(sluiceBin, "agent", "uninstall", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", pol,
			"--host", "h1", "--datastore", "ds1="+dsDir, "--state-dir", state).Run()
	})
	// qemuAt waits until QEMU's throttle of vda is iops, polling libvirt
	// every 10 ms for at most within, and returns when it saw it.
	qemuAt := func(iops int64, within time.Duration) (time.Time, bool) {
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(10 * time.Millisecond) { // polling QEMU
			if l, err := c.IOTune(vm, "vda"); err == nil && l.IOPS == iops {
				return time.Now(), true
			}
		}
		return time.Time{}, false
	}
	if _, ok := qemuAt(120, 30*time.Second); !ok {
		l, err := c.IOTune(vm, "vda")
		t.Fatalf("the agent did not set vda's first throttle (120 IOPS) within 30 s: QEMU has %+v (%v)", l, err)
	}
	for _, n := range []int64{60, 200, 45} {
		start := time.Now()
		livelab.Ctl(t, sluiceBin, conn, 0, "set", vm+"/d0", fmt.Sprintf("limit=%d", n), "--reason", "test")
		at, ok := qemuAt(n, 10*time.Second)
		switch took := at.Sub(start); {
		case !ok:
			t.Errorf("ctl set limit=%d: QEMU's throttle not %d IOPS 10 s later (%s)", n, n, machine.Between(start, time.Now()))
		case took > time.Second:
			t.Errorf("ctl set limit=%d reached QEMU %v after the set's start, want ≤ 1 s (%s)", n, took.Round(time.Millisecond), machine.Between(start, at))
		default:
			t.Logf("ctl set limit=%d reached QEMU %v after the set's start", n, took.Round(time.Millisecond))
		}
	}
}
