package main

import (
	"testing"
	"time"

	"sluice/storage"
)

// gatewayMeasured reads the capacities a host's gateway measured from its
// status file, whole IOPS, and nothing from a file that is stale or
// absent.
func TestGatewayMeasured(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1000, 0)
	if m := gatewayMeasured(dir, "c", "h1", now, 30*time.Second); m != nil {
		t.Fatalf("no status file: %v, want nothing", m)
	}
	st := storage.Status{Host: "h1", TimeUnixNs: now.Add(-5 * time.Second).UnixNano(), Datastores: []storage.DatastoreStatus{
		{Name: "ds1", MeasuredIOPS: 1584.7, CapacityPeriods: 31}, {Name: "ds2", CapacityPeriods: 3}}}
	if err := writeTestJSON(gatewayStatusFile(dir, "c", "h1"), st); err != nil {
		t.Fatal(err)
	}
	if m := gatewayMeasured(dir, "c", "h1", now, 30*time.Second); len(m) != 1 || m["ds1"] != 1584 {
		t.Fatalf("measured %v, want ds1: 1584", m)
	}
	if m := gatewayMeasured(dir, "c", "h1", now.Add(time.Minute), 30*time.Second); m != nil {
		t.Fatalf("a status file a minute old: %v, want nothing", m)
	}
}
