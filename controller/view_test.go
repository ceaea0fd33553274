package controller

import "testing"

// TestReportCacheOrder: a report put directly at revision 10 is not
// replaced by the watch's late delivery of the registration at 8, nor
// removed by a delete older than it; later events apply.
func TestReportCacheOrder(t *testing.T) {
	rc := &reportCache{m: map[string]*Report{}, rev: map[string]int64{}}
	rc.put("h1", &Report{RatesBps: map[string]float64{"vm1/nic0": 8e9}}, 10)
	rc.event("h1", 8, false, []byte(`{"vms":["vm1","vm2"]}`))
	rc.event("h1", 9, true, nil)
	if r := rc.m["h1"]; r == nil || r.RatesBps["vm1/nic0"] != 8e9 {
		t.Fatalf("after older events: %+v, want the report put at 10", r)
	}
	rc.event("h1", 11, false, []byte(`{"vms":["vm1"]}`))
	if r := rc.m["h1"]; r == nil || len(r.VMs) != 1 || r.RatesBps != nil {
		t.Fatalf("after a newer put: %+v", r)
	}
	rc.put("h1", &Report{}, 11) // the same revision, delivered twice
	rc.event("h1", 12, true, nil)
	if _, ok := rc.m["h1"]; ok {
		t.Fatal("a newer delete left the report")
	}
}
