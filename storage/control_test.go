package storage

import (
	"math"
	"testing"

	"sluice/policy"
)

func TestStatsRecordRoundTrip(t *testing.T) {
	r := statsRecord{Host: "h2", PeriodEndNs: 1234567890, PeriodNs: 1e9, IOs: 1600, NormLatSumNs: 1600 * 12e6, Window: 10.5, ActiveShares: 3000}
	b := r.encode()
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
	if v.hosts != 2 || math.Abs(v.latNs-13e6) > 1 || v.totalShares != 5000 || v.totalWindow != 20 {
		t.Fatalf("view %+v, want 2 hosts, 13 ms, 5000 shares, window 20", v)
	}
}

func TestLayout(t *testing.T) {
	p := &policy.Policy{
		Hosts:      []policy.Host{{Name: "h1"}, {Name: "h2"}},
		Datastores: []policy.Datastore{{Name: "ds1"}, {Name: "ds2"}},
		VMs: []policy.VM{
			{Name: "vm1", Disks: []policy.Disk{{Name: "a", Datastore: "ds1", Size: 3 << 20}, {Name: "b", Datastore: "ds2", Size: 1 << 20}}},
			{Name: "vm2", Disks: []policy.Disk{{Name: "a", Datastore: "ds1", Size: 1<<20 + 1}, {Name: "c", Datastore: "ds1"}}},
		},
	}
	ext, req := Layout(p, "ds1")
	want := []Extent{
		{VM: "vm1", Disk: "a", OffBytes: 0, SizeBytes: 3 << 20},
		{VM: "vm2", Disk: "a", OffBytes: 3 << 20, SizeBytes: 1<<20 + 1},
		{VM: "vm2", Disk: "c", OffBytes: 5 << 20, SizeBytes: DefaultDiskBytes},
	}
	if len(ext) != len(want) {
		t.Fatalf("extents %+v", ext)
	}
	for i := range want {
		if ext[i] != want[i] {
			t.Errorf("extent %d = %+v, want %+v", i, ext[i], want[i])
		}
	}
	if wantReq := uint64(5<<20+DefaultDiskBytes) + StatsRegionBytes; req != wantReq {
		t.Errorf("required %d bytes, want %d", req, wantReq)
	}
	off, err := statsSlot(p, "h2", req)
	if err != nil || off != req-StatsRegionBytes+StatsSlotBytes {
		t.Errorf("stats slot of h2 = %d, %v", off, err)
	}
}
