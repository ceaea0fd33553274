package storage

import (
	"math"
	"testing"

	"sluice/policy"
)

func TestStatsRecordRoundTrip(t *testing.T) {
	r := statsRecord{Host: "h2", PeriodEndNs: 1234567890, PeriodNs: 1e9, IOs: 1600, NormLatSumNs: 1600 * 12e6, Window: 10.5, ActiveShares: 3000}
	b := encodeStatsRecord(r)
	if len(b) != StatsSlotBytes {
		t.Fatalf("record is %d bytes, want %d", len(b), StatsSlotBytes)
	}
	got, ok := decodeStatsRecord(b)
	if !ok || got != r {
		t.Fatalf("decode: ok=%v %+v, want %+v", ok, got, r)
	}
	b[30] ^= 1 // a torn or foreign record is ignored, not misread
	if _, ok := decodeStatsRecord(b); ok {
		t.Fatal("corrupted record decoded")
	}
	if _, ok := decodeStatsRecord(make([]byte, StatsSlotBytes)); ok {
		t.Fatal("empty slot decoded")
	}
}

// The datastore-wide latency is the IOPS-weighted mean of fresh records;
// stale hosts (more than 3 periods old) do not count.
func TestDatastoreView(t *testing.T) {
	now := int64(100e9)
	recs := []statsRecord{
		{Host: "h1", PeriodEndNs: now - 0.5e9, PeriodNs: 1e9, IOs: 1000, NormLatSumNs: 1000 * 10e6, Window: 8, ActiveShares: 2000},
		{Host: "h2", PeriodEndNs: now - 0.2e9, PeriodNs: 1e9, IOs: 3000, NormLatSumNs: 3000 * 14e6, Window: 12, ActiveShares: 3000},
		{Host: "h3", PeriodEndNs: now - 10e9, PeriodNs: 1e9, IOs: 5000, NormLatSumNs: 5000 * 100e6, Window: 50, ActiveShares: 1000},
	}
	v := viewOf(recs, now)
	if v.Hosts != 2 || math.Abs(v.LatNs-13e6) > 1 || v.TotalShares != 5000 || v.TotalWindow != 20 {
		t.Fatalf("view %+v, want 2 hosts, 13 ms, 5000 shares, window 20", v)
	}
}

// Every disk has its own volume, named after the VM and the disk; the
// order of VMs plays no part.
func TestVolumes(t *testing.T) {
	p := &policy.Policy{
		Hosts:      []policy.Host{{Name: "h1"}, {Name: "h2"}},
		Datastores: []policy.Datastore{{Name: "ds1"}, {Name: "ds2"}},
		VMs: []policy.VM{
			{Name: "vm1", Disks: []policy.Disk{{Name: "a", Datastore: "ds1", Size: 3 << 20}, {Name: "b", Datastore: "ds2", Size: 1 << 20}}},
			{Name: "vm2", Disks: []policy.Disk{{Name: "a", Datastore: "ds1", Size: 1<<20 + 1}, {Name: "c", Datastore: "ds1"}}},
		},
	}
	vols := Volumes(p, "ds1")
	want := []Volume{
		{VM: "vm1", Disk: "a", SizeBytes: 3 << 20},
		{VM: "vm2", Disk: "a", SizeBytes: 1<<20 + 1},
		{VM: "vm2", Disk: "c", SizeBytes: DefaultDiskBytes},
	}
	if len(vols) != len(want) {
		t.Fatalf("volumes %+v", vols)
	}
	for i := range want {
		if vols[i] != want[i] {
			t.Errorf("volume %d = %+v, want %+v", i, vols[i], want[i])
		}
	}
	if n, e := vols[2].Name(), vols[2].Export(); n != "vm2+c.img" || e != "vm2/c" {
		t.Errorf("volume name %q export %q, want vm2+c.img, vm2/c", n, e)
	}
}

// A host keeps its stats slot, finds it again by name after a restart,
// takes the lowest free or stale slot otherwise, and moves when another
// live host writes into its slot; the scan grows with the highest live
// slot.
func TestChooseSlot(t *testing.T) {
	const now = int64(1000e9)
	live := func(h string) slotRead { return slotRead{rec: rec(h, now-1e9, 1, 0, 1, 1), ok: true} }
	stale := func(h string) slotRead { return slotRead{rec: rec(h, now-100e9, 1, 0, 1, 1), ok: true} }
	empty := slotRead{}
	cases := []struct {
		name      string
		cur       int
		slots     []slotRead
		wantSlot  int
		wantScanN int
	}{
		{"new host, empty volume", -1, []slotRead{empty, empty, empty, empty}, 0, 1 + minScan},
		{"new host after two", -1, []slotRead{live("h2"), live("h3"), empty, empty}, 2, 3 + minScan},
		{"restart finds its name", -1, []slotRead{live("h2"), empty, live("h1"), empty}, 2, 3 + minScan},
		{"keeps its slot", 1, []slotRead{empty, live("h1"), live("h2"), empty}, 1, 3 + minScan},
		{"stale slot taken", -1, []slotRead{stale("h9"), live("h2"), empty, empty}, 0, 2 + minScan},
		{"collision: moves on", 0, []slotRead{live("h2"), empty, empty, empty}, 1, 2 + minScan},
		{"beyond the scan", -1, []slotRead{live("h2"), live("h3"), live("h4"), live("h5")}, 4, 5 + minScan},
	}
	for _, c := range cases {
		slot, scan := chooseSlot("h1", c.cur, c.slots, now)
		if slot != c.wantSlot || scan != c.wantScanN {
			t.Errorf("%s: slot %d scan %d, want %d, %d", c.name, slot, scan, c.wantSlot, c.wantScanN)
		}
	}
}
