package main

import (
	"bytes"
	"strings"
	"testing"

	"sluice/agent"
)

// TestAgentStatusThrottle: agent status shows the throttle driver's last
// period from its status file: each datastore's budget, latencies and
// measured capacity, each disk's I/O and throttle.
func TestAgentStatusThrottle(t *testing.T) {
	dir := t.TempDir()
	if err := agent.WriteStats(dir, agent.Stats{Cluster: "c", Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	ts := agent.ThrottleStatus{Cluster: "c", Host: "h1", TimeUnixNs: 1, PeriodS: 1, Datastores: []agent.ThrottleDatastoreStatus{
		{Name: "nfs1", SIOC: true, Window: 5.99, BudgetIOPS: 499, DatastoreLatencyMs: 30.28, HostLatencyMs: 30, ThresholdMs: 12, HostsSeen: 2, MeasuredIOPS: 500, CapacityPeriods: 5},
		{Name: "ds2", BudgetIOPS: -1, Error: "read stats: permission denied"},
	}, Disks: []agent.ThrottleDiskStatus{
		{Disk: "vm1/d0", Datastore: "nfs1", VM: "vm1", Target: "vda", IOPS: 150, LatencyMs: 30, EntitlementIOPS: 250, ThrottleIOPS: 250, Why: "shares"},
		{Disk: "vm2/d0", Datastore: "ds2", VM: "vm2", Target: "vdb", EntitlementIOPS: -1, Why: "no limit and no SIOC budget"},
	}}
	if err := writeTestJSON(agent.ThrottleStatusPath(dir, "c", "h1"), ts); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"agent", "status", "--host", "h1", "--state-dir", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	_, got, _ := strings.Cut(out.String(), "\n")      // the agent's line has the age
	_, got, _ = strings.Cut(got, "throttle driver: ") // so has the driver's
	_, got, _ = strings.Cut(got, "\n")
	want := `  DATASTORE   SIOC  WINDOW  BUDGET IOPS  LATENCY ms  HOST LATENCY ms  THRESHOLD ms  HOSTS                         MEASURED CAPACITY
       nfs1   true    5.99          499       30.28            30.00            12      2  500 IOPS (median of 5 congested periods)
        ds2  false    0.00    unbounded        0.00             0.00             0      0        not yet (0 of 5 congested periods)
    DISK   VM  TARGET   IOPS  LATENCY ms  ENTITLED IOPS  THROTTLE IOPS                          WHY
  vm1/d0  vm1     vda  150.0       30.00            250            250                       shares
  vm2/d0  vm2     vdb    0.0        0.00      unbounded           none  no limit and no SIOC budget
datastore ds2: read stats: permission denied
`
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}
