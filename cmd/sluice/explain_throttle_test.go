package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/explain"
	"sluice/policy"
)

// explain VM/DISK says the driver and, from the throttle driver's status
// file of the disk's host, the host's budget, the latencies and why the
// disk gets its throttle.
func TestExplainThrottle(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: ds1
    driver: throttle
    sioc: {enabled: true, congestionThreshold: 12ms}
vms:
  - name: vm1
    host: h1
    disks: [{name: d0, datastore: ds1, limitIOPS: 120}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := explain.DriverLine(&p.Datastores[0]); got != "driver: throttle (datastore ds1 says so)" {
		t.Errorf("driver line %q", got)
	}
	dir := t.TempDir()
	st := agent.ThrottleStatus{Cluster: "t", Host: "h1", TimeUnixNs: 1, PeriodS: 1,
		Datastores: []agent.ThrottleDatastoreStatus{{Name: "ds1", SIOC: true, Window: 2.5, BudgetIOPS: 208, HostLatencyMs: 9.5, DatastoreLatencyMs: 11, ThresholdMs: 12, HostsSeen: 2, Probes: 10, MeasuredIOPS: 482, CapacityPeriods: 37}},
		Disks: []agent.ThrottleDiskStatus{{Disk: "vm1/d0", Datastore: "ds1", VM: "vm1", Target: "vda", Shares: 1000, LimitIOPS: 120,
			IOPS: 119, LatencyMs: 300, Bound: true, DemandIOPS: -1, EntitlementIOPS: 120, ThrottleIOPS: 120, Why: "limit"}}}
	if err := writeTestJSON(agent.ThrottleStatusPath(dir, "t", "h1"), st); err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(throttleLines(p, "h1", "vm1/d0", dir), "\n")
	for _, want := range []string{"host budget 208 IOPS = window 2.50 / threshold 12 ms", "datastore latency 11.00 ms over 2 hosts, this host's 9.50 ms (10 probes)",
		"datastore ds1 capacity measured (periods at or above 12 ms): 482 IOPS (median of 37 congested periods)",
		"held by its throttle", "QEMU throttle 120 IOPS (of 32 KiB units): limit"} {
		if !strings.Contains(lines, want) {
			t.Errorf("explain lacks %q:\n%s", want, lines)
		}
	}
	if l := throttleLines(p, "h1", "vm1/d0", t.TempDir()); l != nil {
		t.Errorf("without a status file: %q, want nothing", l)
	}
}

func writeTestJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
