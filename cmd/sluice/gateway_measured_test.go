package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/agent"
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

// TestHookCountsMeasuredCapacity: when the agent does not answer, the
// hook's fallback counts the capacity the host's throttle driver measured
// last (the agent's status file, however old), as the agent would: with
// vm1 running, vm2's 300 IOPS reservation fits a datastore of unknown
// capacity and not one measured at 500 IOPS.
func TestHookCountsMeasuredCapacity(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(`cluster: c
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: nfs1
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: nfs1, reservationIOPS: 300}]}
  - {name: vm2, host: h1, disks: [{name: d0, datastore: nfs1, reservationIOPS: 300}]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := `<domstatus state='running' pid='1'><domain type='qemu' id='1'><name>vm1</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain></domstatus>`
	if err := os.WriteFile(filepath.Join(runDir, "vm1.xml"), []byte(status), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "admit-h1.sock") // nobody listens: the agent does not answer
	hook := func() (int, string) {
		var errb bytes.Buffer
		code := runHookQemu([]string{"--policy", pf, "--host", "h1", "--agent", sock, "--", "vm2", "prepare", "begin", "-"},
			strings.NewReader("<domain type='qemu'><name>vm2</name></domain>"), &errb, runDir)
		return code, errb.String()
	}
	if code, msg := hook(); code != exitOK {
		t.Fatalf("nothing measured: exit %d %q; want vm2 admitted", code, msg)
	}
	st := agent.ThrottleStatus{Cluster: "c", Host: "h1", TimeUnixNs: time.Unix(1000, 0).UnixNano(),
		Datastores: []agent.ThrottleDatastoreStatus{{Name: "nfs1", MeasuredIOPS: 500.6, CapacityPeriods: 12}}}
	if err := writeTestJSON(agent.ThrottleStatusPath(dir, "c", "h1"), st); err != nil {
		t.Fatal(err)
	}
	code, msg := hook()
	if code != exitBad || !strings.Contains(msg, "datastore nfs1") || !strings.Contains(msg, "measured") ||
		!strings.Contains(msg, "with the capacities this host measured last") || strings.Count(strings.TrimSpace(msg), "\n") > 0 {
		t.Fatalf("measured 500 IOPS: exit %d %q; want vm2 refused in one line, naming the measured capacity", code, msg)
	}
	t.Log(msg)
}
