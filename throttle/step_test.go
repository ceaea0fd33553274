package throttle

import (
	"testing"

	"sluice/alloc"
	"sluice/entitle"
)

func TestLimitsFor(t *testing.T) {
	for _, tc := range []struct {
		iops float64
		want Limits
	}{
		{alloc.Inf, Limits{}},
		{0, Limits{IOPS: 1, BytesPerS: UnitBytes, SizeIOPS: UnitBytes}},
		{149.2, Limits{IOPS: 150, BytesPerS: 150 * UnitBytes, SizeIOPS: UnitBytes}},
	} {
		if got := LimitsFor(tc.iops); got != tc.want {
			t.Errorf("LimitsFor(%v) = %+v, want %+v", tc.iops, got, tc.want)
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
