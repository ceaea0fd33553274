package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"sluice/agent"
)

// TestAgentStatusCPU: agent status shows each VM's CPU setting and use,
// in the table and in JSON.
func TestAgentStatusCPU(t *testing.T) {
	dir := t.TempDir()
	s := agent.Stats{Cluster: "c", Host: "h1", Dynamic: true, CPUCapacityMHz: 2000, CPU: []agent.CPUStat{
		{VM: "vm1", Cgroup: "sl-c-vm1", EntitlementMHz: 700, Reason: "reservation", DemandMHz: -1, Weight: 3500, Shares: 35840,
			CPUMax: "max 100000", UsedPct: 69.8, ReadyPct: 12.5},
		{VM: "vm3", Cgroup: "sl-c-vm3", EntitlementMHz: 300, Reason: "limit", DemandMHz: -1, Weight: 1500, Shares: 15360,
			CPUMax: "30000 100000", UsedPct: 30, ThrottledPct: 69.8, ReadyPct: 70.1, PressurePct: 69.9,
			Err: "cpu vm3: stats sl-c-vm3: gone"},
	}}
	if err := agent.WriteStats(dir, s); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"agent", "status", "--host", "h1", "--state-dir", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := out.String()
	_, got, _ = strings.Cut(got, "\n") // the first line has the age
	want := `cpu: 2000 MHz shared
   VM  ENTITLED MHz       REASON  WEIGHT  SHARES       CPU.MAX  USED %  THROTTLED %  READY %  PSI %
  vm1           700  reservation    3500   35840    max 100000    69.8          0.0     12.5      -
  vm3           300        limit    1500   15360  30000 100000    30.0         69.8     70.1   69.9
cpu vm3: stats sl-c-vm3: gone
`
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	out.Reset()
	if code := run([]string{"agent", "status", "--host", "h1", "--state-dir", dir, "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var back agent.Stats
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || len(back.CPU) != 2 || back.CPU[1].ThrottledPct != 69.8 || back.CPU[0].Weight != 3500 {
		t.Errorf("json: %v %+v", err, back.CPU)
	}
	if !strings.Contains(out.String(), `"ready_pct": 12.5`) {
		t.Errorf("json has no ready_pct 12.5:\n%s", out.String())
	}
}
