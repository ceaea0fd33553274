package agent

import (
	"fmt"
	"testing"

	"sluice/policy"
)

const arrivePolicy = `cluster: t
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps, usable: 956Mbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps, usable: 956Mbps}]
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm2, host: h1, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: %s, nics: [{name: nic0, shares: normal}]}
`

// TestArrivingVNIC: a VM that migrates onto a busy host (its class is
// new) keeps its full entitlement for its first demand window although
// its sender, stalled by the move, sends little at first, so that its TCP
// can ramp up against a neighbour that takes all it is given; a vNIC
// that still sends little after that window gets Headroom × its rate, as
// any other.
func TestArrivingVNIC(t *testing.T) {
	parse := func(host string) *policy.Policy {
		p, err := policy.Parse("arrive.yaml", []byte(fmt.Sprintf(arrivePolicy, host)))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	before, after := parse("h2"), parse("h1")
	k := NewFakeKernel()
	inv := testInventory(before, "h1")
	a, err := New(Config{Policy: before, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	devs := func() {
		for _, tr := range a.Trees() {
			if k.Devs[tr.Dev] == nil {
				k.Devs[tr.Dev] = &FakeDev{}
			}
			for _, v := range tr.VNICs {
				if k.Devs[v.Dev] == nil {
					k.Devs[v.Dev] = &FakeDev{}
				}
			}
		}
	}
	devs()
	step := func(ms int64, mbps map[string]float64) map[string]PortStat {
		t.Helper()
		for port, r := range mbps {
			id, dev := findPort(a, port)
			if err := k.AddTraffic(dev, id, uint64(r*1e6/8*0.1)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Step(ms * 1e6); err != nil {
			t.Fatalf("step at %d ms: %v", ms, err)
		}
		out := map[string]PortStat{}
		for _, pt := range a.Stats().Uplinks[0].Ports {
			out[pt.Port] = pt
		}
		return out
	}
	step(100, nil) // installs the tree
	ms := int64(200)
	for ; ms < 2000; ms += 100 { // vm2 alone takes the line
		step(ms, map[string]float64{"vm2/nic0": 1000})
	}
	*inv = *testInventory(after, "h1") // vm3 arrives
	if err := a.SetPolicy(after); err != nil {
		t.Fatal(err)
	}
	devs()
	step(ms, map[string]float64{"vm2/nic0": 1000}) // creates vm3's class
	created := ms
	for ms += 100; ms < created+DemandWindowNs/1e6; ms += 100 {
		st := step(ms, map[string]float64{"vm2/nic0": 900, "vm3/nic0": 30})
		if e := st["vm3/nic0"].EntitlementBps; e != 478e6 {
			t.Fatalf("%d ms after vm3 arrived, sending 30 Mbit/s: entitled %.1f Mbit/s, want its share 478", ms-created, e/1e6)
		}
	}
	for ; ms < created+2*DemandWindowNs/1e6; ms += 100 {
		step(ms, map[string]float64{"vm2/nic0": 900, "vm3/nic0": 30})
	}
	st := step(ms, map[string]float64{"vm2/nic0": 900, "vm3/nic0": 30})
	if e := st["vm3/nic0"].EntitlementBps; e > 100e6 {
		t.Fatalf("vm3 still sending 30 Mbit/s 2 s after it arrived: entitled %.1f Mbit/s, want Headroom × its rate", e/1e6)
	}
}
