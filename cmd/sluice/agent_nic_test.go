package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/nicinfo"
)

// TestAgentStatusNIC: agent status shows under each uplink what the agent
// read of its NIC, the root qdisc sluice replaced, what is unknown and
// the warnings; the JSON has them under "nic".
func TestAgentStatusNIC(t *testing.T) {
	dir := t.TempDir()
	s := agent.Stats{Cluster: "c", Host: "h1", Dynamic: true, Uplinks: []agent.UplinkStat{{Uplink: "up0", Dev: "eth0", SpeedBps: 10e9, UsableBps: 9.4e9,
		NIC: &agent.UplinkNIC{Info: nicinfo.Info{Dev: "eth0", Driver: "ixgbe", DriverVersion: "6.18", SpeedBps: 10e9, Duplex: "full", TxQueues: 8, RxQueues: 8,
			Channels: &nicinfo.Channels{Combined: 8, MaxCombined: 63, Other: 1, MaxOther: 1},
			Offloads: []nicinfo.Offload{{Name: "tso", On: true}, {Name: "gso", On: true}, {Name: "gro"}, {Name: "lro", Fixed: true}}},
			RootBefore: "mq", Warnings: []string{"GRO is off on eth0: (…)", agent.MQNote("eth0", 8)}}}}}
	s.Uplinks = append(s.Uplinks, agent.UplinkStat{Uplink: "up1", Dev: "lo", SpeedBps: 1e9, UsableBps: 1e9,
		NIC: &agent.UplinkNIC{Info: nicinfo.Info{Dev: "lo", TxQueues: 1, RxQueues: 1, Unknown: []string{"driver (not supported by the device)", "speed (not supported by the device)"}},
			Error: "FEATURES_GET lo: no buffer space"}})
	if err := agent.WriteStats(dir, s); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"agent", "status", "--host", "h1", "--state-dir", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	_, got, _ := strings.Cut(out.String(), "\n") // the first line has the age
	want := `uplink up0 (eth0) speed 10Gbps usable 9.4Gbps
  nic: driver ixgbe 6.18, 10Gb/s full duplex, 8 TX/8 RX queues, channels other 1/1 combined 8/63; TSO on, GSO on, GRO off, LRO off (fixed)
  nic: root qdisc before sluice: mq
  warning: GRO is off on eth0: (…)
  warning: root qdisc of eth0 was mq over 8 TX queues; sluice replaced it with one HTB tree: the 8 queues now funnel through one qdisc lock (docs/agent.md, "The uplink's NIC": the plan for 25-100 GbE)
`
	if !strings.HasPrefix(got, want) {
		t.Errorf("table:\n%s\nwant it to begin with:\n%s", got, want)
	}
	for _, line := range []string{"  nic: driver ?, speed ?, 1 TX/1 RX queues, channels ?, offloads ?\n",
		"  nic: unknown: driver (not supported by the device); speed (not supported by the device)\n",
		"  nic: error: FEATURES_GET lo: no buffer space\n"} {
		if !strings.Contains(got, line) {
			t.Errorf("table lacks %q:\n%s", line, got)
		}
	}
	out.Reset()
	if code := run([]string{"agent", "status", "--host", "h1", "--state-dir", dir, "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var back agent.Stats
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Uplinks[0].NIC == nil || back.Uplinks[0].NIC.RootBefore != "mq" ||
		back.Uplinks[0].NIC.Channels.MaxCombined != 63 || back.Uplinks[0].NIC.Driver != "ixgbe" {
		t.Errorf("json: %v %+v", err, back.Uplinks[0].NIC)
	}
	for _, key := range []string{`"nic": {`, `"root_before": "mq"`, `"tx_queues": 8`, `"name": "gro",`, `"speed_bps": 10000000000`} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("json lacks %s:\n%s", key, out.String())
		}
	}
}
