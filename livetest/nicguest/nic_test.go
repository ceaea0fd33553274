// Package nicguest checks what the agent reads of an uplink (package
// nicinfo: driver, speed, queues, channels, offloads through ethtool
// netlink) on a QEMU guest's virtio NIC, as on a host that is itself a
// VM: nicinfo's TestReadDev runs inside a lab guest against the guest's
// eth0, with the ethtool CLI and ip -d link in the guest as the oracle.
package nicguest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
)

const guestPolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
vms:
  - name: vm1
    host: h1
    lab: {kind: qemu}
    nics: [{name: nic0, shares: normal}]
`

func TestGuestVirtioNIC(t *testing.T) {
	livelab.GuestPreflight(t, "ethtool", "go")
	// The guest mounts the host's root read-only and has a /tmp and a
	// /run of its own: the test binary goes where the guest sees it.
	dir, err := os.MkdirTemp("/var/tmp", "sl-nicguest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "nicinfo.test")
	if b, err := exec.Command("go", "test", "-c", "-o", bin, "sluice/nicinfo").CombinedOutput(); err != nil {
		t.Fatalf("go test -c sluice/nicinfo: %v: %s", err, b)
	}

	l := livelab.UpGuestLab(t, "ng", guestPolicy, lab.Options{GuestTTL: 3 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := lab.GuestExec(ctx, l.P.Cluster, "vm1", bin, "-test.run", "^TestReadDev$", "-test.v", "-dev", "eth0")
	t.Logf("in the guest, %s -test.run TestReadDev -dev eth0:\n%s%s", bin, res.Stdout, res.Stderr)
	if err != nil {
		t.Fatalf("in the guest: %v", err)
	}
	if res.Exit != 0 || !strings.Contains(string(res.Stdout), "--- PASS: TestReadDev") {
		t.Fatalf("TestReadDev in the guest: exit %d", res.Exit)
	}
	// What the agent shows of it: the driver is virtio's, its queues and
	// offloads are known.
	if s := string(res.Stdout); !strings.Contains(s, "eth0: driver virtio_net") {
		t.Errorf("the guest's eth0 is not read as virtio_net: %s", s)
	}
}
