// Package throttlelive tests the throttle driver with QEMU under the
// machine's libvirtd: the driver's libvirt side (virt.Libvirt's block
// stats and block I/O tune) on a real domain, and the driver around it.
// The tests need root, libvirtd and qemu-img; a missing piece fails them
// with its reason. Everything they create is named sl-tt…- and removed
// when they end, also when they fail.
package throttlelive

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/livetest/livelab"
	"sluice/parda"
	"sluice/throttle"
	"sluice/virt"
)

// bareDomain starts a transient domain named sl-tt<hex>-vm with two qcow2
// disks (serials d0 and d1) in a fresh directory (livelab.BareDomain):
// enough for QEMU's block layer. Its directory is removed when the test
// ends.
func bareDomain(t *testing.T, c *virt.Libvirt) (name string) {
	t.Helper()
	name = "sl-tt" + livelab.RandHex(2) + "-vm"
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var disks string
	for i, dk := range []string{"d0", "d1"} {
		img := filepath.Join(dir, dk+".qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "64M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
		disks += fmt.Sprintf(`<disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/><source file='%s'/><target dev='vd%c' bus='virtio'/><serial>%s</serial></disk>`,
			img, 'a'+i, dk)
	}
	livelab.BareDomain(t, c, name, 64, disks)
	return name
}

// The libvirt side of the driver on a real QEMU: counters of both disks by
// serial, a throttle set is the throttle QEMU reports, and the driver
// gives back the original throttle on uninstall.
func TestLibvirtIOTune(t *testing.T) {
	c := livelab.Libvirt(t, "qemu-img")
	vm := bareDomain(t, c)

	disks, err := c.BlockStats([]string{vm, "sl-tt-no-such-vm"})
	if err != nil {
		t.Fatalf("BlockStats: %v", err)
	}
	if len(disks) != 2 || disks[0].Serial != "d0" || disks[0].Target != "vda" || disks[1].Serial != "d1" {
		t.Fatalf("BlockStats = %+v, want vda (d0) and vdb (d1)", disks)
	}
	checkCountersAgainstVirsh(t, c, vm)
	orig, err := c.IOTune(vm, "vda")
	if err != nil {
		t.Fatal(err)
	}
	if orig.IOPS != 0 {
		t.Fatalf("a new domain's vda has total_iops_sec %d, want 0", orig.IOPS)
	}
	want := throttle.LimitsFor(150)
	if err := c.SetIOTune(vm, "vda", want); err != nil {
		t.Fatal(err)
	}
	got, err := c.IOTune(vm, "vda")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("after SetIOTune(%+v), QEMU reports %+v", want, got)
	}

	// The driver: one period sets both disks (no SIOC: the limit on d0
	// only, d1 has none and is left alone), uninstall gives d0 back.
	d := &throttle.Driver{Host: "h1", Datastore: "ds1", HV: c, Stats: &memStats{}}
	if err := c.SetIOTune(vm, "vda", orig); err != nil {
		t.Fatal(err)
	}
	specs := []entitle.DiskSpec{
		{Name: vm + "/d0", VM: vm, Disk: "d0", Shares: 1000, LimitIOPS: 200},
		{Name: vm + "/d1", VM: vm, Disk: "d1", Shares: 1000, LimitIOPS: alloc.Inf},
	}
	if _, err := d.Period(specs, time.Now().UnixNano(), 1e9, nil); err != nil {
		t.Fatalf("Period: %v", err)
	}
	got0, _ := c.IOTune(vm, "vda")
	got1, _ := c.IOTune(vm, "vdb")
	if got0.IOPS != 200 || got1.IOPS != 0 {
		t.Fatalf("after a period: vda %d IOPS, vdb %d IOPS; want 200 and 0", got0.IOPS, got1.IOPS)
	}
	if err := d.Restore([]string{vm}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got0, _ = c.IOTune(vm, "vda"); got0.IOPS != 0 {
		t.Fatalf("after uninstall vda has %d IOPS, want its original 0", got0.IOPS)
	}
}

// memStats is a datastore's stats kept in memory (one host).
type memStats struct{ recs []parda.Record }

func (s *memStats) Read() ([]parda.Record, error) { return s.recs, nil }
func (s *memStats) Write(r parda.Record) error    { s.recs = []parda.Record{r}; return nil }

// checkCountersAgainstVirsh: vda's counters as BlockStats reads them
// (libvirt's domain stats) against virsh domblkstat's, the oracle, read
// between two BlockStats reads: the counters only grow, so virsh's
// operations, bytes and times lie between the two reads' (the I/O is the
// firmware's reads of the disk as it looks for something to boot).
func checkCountersAgainstVirsh(t *testing.T, c *virt.Libvirt, vm string) {
	t.Helper()
	vda := func() throttle.Counters {
		ds, err := c.BlockStats([]string{vm})
		if err != nil || len(ds) == 0 || ds[0].Target != "vda" {
			t.Fatalf("BlockStats: %+v, %v", ds, err)
		}
		return ds[0].Counters
	}
	// The firmware's first read of vda (its boot sector) is the I/O
	// compared: wait for it, for at most a minute of TCG firmware.
	deadline := time.Now().Add(time.Minute)
	before := vda()
	for before.Ops == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("vda: no I/O a minute after the domain started (counters %+v): nothing to compare", before)
		}
		time.Sleep(50 * time.Millisecond) // polling QEMU's counters for the firmware's read
		before = vda()
	}
	out, err := exec.Command("virsh", "domblkstat", vm, "vda").CombinedOutput()
	if err != nil {
		t.Fatalf("virsh domblkstat: %v: %s", err, out)
	}
	after := vda()
	var v throttle.Counters
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		n, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			continue
		}
		switch f[1] {
		case "rd_req", "wr_req", "flush_operations":
			v.Ops += n
		case "rd_bytes", "wr_bytes":
			v.Bytes += n
		case "rd_total_times", "wr_total_times", "flush_total_times":
			v.TimeNs += n
		}
	}
	t.Logf("vda: BlockStats %+v, virsh %+v, BlockStats %+v", before, v, after)
	if v.Ops < before.Ops || v.Ops > after.Ops || v.Bytes < before.Bytes || v.Bytes > after.Bytes || v.TimeNs < before.TimeNs || v.TimeNs > after.TimeNs {
		t.Errorf("vda's counters: virsh domblkstat %+v, not between BlockStats' %+v and %+v", v, before, after)
	}
}
