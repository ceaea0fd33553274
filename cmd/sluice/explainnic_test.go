package main

import (
	"strings"
	"testing"

	"sluice/agent"
	"sluice/entitle"
	"sluice/nicinfo"
	"sluice/policy"
)

// explain of a port ends with what the agent of its host read of the
// uplink's NIC (its statistics file): the NIC, the root qdisc sluice
// replaced and the warnings, per uplink the port sends through; nothing
// without the file, and nothing for the inbound tree.
func TestExplainNIC(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}, {name: u1, speed: 10Gbps}]
  - name: h2
    uplinks: [{name: u0, speed: 10Gbps}]
trafficClasses:
  nfs: {shares: normal, ingress: {shares: high}}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, uplink: u1, reservation: 1Gbps, ingress: {reservation: 1Gbps}}]}
  - {name: vm2, host: h2, nics: [{name: nic0}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	nic := func(dev string) *agent.UplinkNIC {
		return &agent.UplinkNIC{Info: nicinfo.Info{Dev: dev, Driver: "ixgbe", SpeedBps: 10e9, Duplex: "full", TxQueues: 8, RxQueues: 8,
			Channels: &nicinfo.Channels{Combined: 8, MaxCombined: 63}, Offloads: []nicinfo.Offload{{Name: "tso", On: true}, {Name: "gro"}}},
			RootBefore: "mq", Warnings: []string{"GRO is off on " + dev, agent.MQNote(dev, 8)}, ReadNs: 1}
	}
	s := agent.Stats{Cluster: "t", Host: "h1", Uplinks: []agent.UplinkStat{
		{Uplink: "u0", Dev: "eth0", NIC: nic("eth0")},
		{Uplink: "u1", Dev: "eth1", NIC: nic("eth1")},
		{Uplink: "u1", Dev: "sl-in-eth1", Direction: "inbound"},
	}}
	if err := agent.WriteStats(dir, s); err != nil {
		t.Fatal(err)
	}
	live := entitle.Live{}
	got := strings.Join(nicLines(p, live, "vm1/nic0", dir), "\n")
	for _, want := range []string{
		"live, NIC of uplink u1 on host h1 (eth1, read by its agent ",
		"  driver ixgbe, 10Gb/s full duplex, 8 TX/8 RX queues, channels combined 8/63; TSO on, GRO off; root qdisc before sluice: mq",
		"  warning: GRO is off on eth1",
		"  warning: root qdisc of eth1 was mq over 8 TX queues; sluice replaced it with one HTB tree",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("vm1/nic0 lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "eth0") || strings.Count(got, "live, ") != 1 {
		t.Errorf("vm1/nic0 sends through u1 only:\n%s", got)
	}
	// A class is on every uplink of its host.
	if got := nicLines(p, live, "h1/nfs", dir); len(got) != 2*4 {
		t.Errorf("h1/nfs: %d lines, want 4 per uplink:\n%s", len(got), strings.Join(got, "\n"))
	}
	if got := nicLines(p, live, "vm2/nic0", dir); got != nil {
		t.Errorf("vm2/nic0 without h2's statistics: %q", got)
	}
	if got := nicLines(p, live, "vm1/nic0", t.TempDir()); got != nil {
		t.Errorf("without the statistics file: %q", got)
	}
}
