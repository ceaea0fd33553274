package throttle

import (
	"testing"

	"sluice/alloc"
	"sluice/entitle"
)

func TestLimitsFor(t *testing.T) {
	for _, tc := range []struct {
		iops     float64
		periodNs int64
		want     Limits
	}{
		{alloc.Inf, 1e9, Limits{}},
		{0, 1e9, Limits{IOPS: 1, BytesPerS: UnitBytes, MaxIOPS: 1, MaxBytes: UnitBytes, MaxLengthS: 1, SizeIOPS: UnitBytes}},
		{149.2, 1e9, Limits{IOPS: 150, BytesPerS: 150 * UnitBytes, MaxIOPS: 150, MaxBytes: 150 * UnitBytes, MaxLengthS: 1, SizeIOPS: UnitBytes}},
		{100, 4e9, Limits{IOPS: 100, BytesPerS: 100 * UnitBytes, MaxIOPS: 100, MaxBytes: 100 * UnitBytes, MaxLengthS: 4, SizeIOPS: UnitBytes}},
	} {
		if got := LimitsFor(tc.iops, tc.periodNs); got != tc.want {
			t.Errorf("LimitsFor(%v, %v) = %+v, want %+v", tc.iops, tc.periodNs, got, tc.want)
		}
	}
}

// A disk is found by its serial first, then by its target dev.
func TestMatch(t *testing.T) {
	specs := []entitle.DiskSpec{{Name: "a/d0", VM: "a", Disk: "d0"}, {Name: "a/vdb", VM: "a", Disk: "vdb"}, {Name: "b/d0", VM: "b", Disk: "d0"}}
	disks := []HostDisk{{VM: "a", Target: "d0"}, {VM: "a", Target: "vda", Serial: "d0"}, {VM: "a", Target: "vdb"}, {VM: "c", Target: "vda", Serial: "d0"}}
	ms, hs := Match(specs, disks, nil)
	if len(ms) != 2 || ms[0].Name != "a/d0" || hs[0].Target != "vda" || ms[1].Name != "a/vdb" || hs[1].Target != "vdb" {
		t.Errorf("Match = %v %v", ms, hs)
	}
}
