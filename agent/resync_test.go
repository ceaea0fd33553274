package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"sluice/policy"
)

// changingInventory is a StaticInventory that signals changes and lists
// the running VMs the policy does not name, as the libvirt one does.
type changingInventory struct {
	*StaticInventory
	changes chan struct{}
	named   []string // what the agent told it (SetPolicyVMs)
}

func (c *changingInventory) Changes() <-chan struct{}  { return c.changes }
func (c *changingInventory) SetPolicyVMs(vms []string) { c.named = vms }

const followPolicy = `cluster: t
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, reservation: 100Mbps}]}
  - {name: vm2, host: h1, nics: [{name: nic0, limit: 200Mbps}]}
`

func mustPolicy(t *testing.T, text string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runAgent starts Run in the background with a fake clock; step sends a
// tick and returns that step's statistics and error.
func runAgent(t *testing.T, a *Agent) (step func(now int64) (Stats, error), cancel func()) {
	clock := fakeClock{ch: make(chan time.Time)}
	ctx, stop := context.WithCancel(context.Background())
	type rep struct {
		s   Stats
		err error
	}
	reports := make(chan rep)
	done := make(chan error)
	go func() {
		done <- Run(ctx, a, clock, 1e9, 1e8, func(s Stats, _ Changes, err error) { reports <- rep{s, err} })
	}()
	if r := <-reports; r.err != nil {
		t.Fatalf("first step: %v", r.err)
	}
	return func(now int64) (Stats, error) {
			clock.ch <- time.Unix(0, now)
			r := <-reports
			return r.s, r.err
		}, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
}

// TestRunFollowsInventory: a VM that starts after the agent gets its class
// and classifier at the next step, one that stops loses them, and a VM
// that keeps running keeps its measured history across the re-derivation.
func TestRunFollowsInventory(t *testing.T) {
	p := mustPolicy(t, followPolicy)
	full := testInventory(p, "h1")
	inv := &changingInventory{StaticInventory: &StaticInventory{Running: []string{"vm1"}, Devices: full.Devices,
		VNICs: map[string]VNICMatch{"vm1/nic0": full.VNICs["vm1/nic0"]}}, changes: make(chan struct{})}
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(inv.named, ",") != "vm1,vm2" {
		t.Errorf("inventory told the policy's VMs %v, want vm1,vm2", inv.named)
	}
	step, cancel := runAgent(t, a)
	defer cancel()
	if _, err := step(1.1e9); err != nil {
		t.Fatal(err)
	}
	vm1 := a.ports["sl-up0|vm1/nic0"]
	if vm1 == nil || !vm1.haveLast {
		t.Fatal("vm1 has no history after two steps")
	}
	if _, ok := k.Devs["sl-up0"].Classes[MakeHandle(1, 0x101)]; ok {
		t.Fatal("vm2 has a class before it runs")
	}

	// vm2 starts.
	inv.Running = []string{"vm1", "vm2"}
	inv.VNICs = full.VNICs
	inv.Unnamed = []UnnamedVM{{Name: "stranger"}}
	inv.changes <- struct{}{}
	s, err := step(1.2e9)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := k.Devs["sl-up0"].Classes[MakeHandle(1, 0x101)]
	if !ok {
		t.Fatal("vm2 started but has no class 1:101 after the next step")
	}
	if c.CeilBps > 220e6 || c.CeilBps < 200e6 {
		t.Errorf("vm2's ceil %d, want its 200Mbps limit on the wire", c.CeilBps)
	}
	if k.Devs["sl-v1n0"].VNICClass != MakeHandle(1, 0x101) {
		t.Errorf("vm2's tap classifies into %s, want 1:101", k.Devs["sl-v1n0"].VNICClass)
	}
	if a.ports["sl-up0|vm1/nic0"] != vm1 {
		t.Error("vm1 lost its history when vm2 started")
	}
	if strings.Join(s.Unnamed, ",") != "stranger" {
		t.Errorf("stats list unnamed VMs %v, want stranger", s.Unnamed)
	}

	// vm1 stops.
	inv.Running = []string{"vm2"}
	inv.VNICs = map[string]VNICMatch{"vm2/nic0": full.VNICs["vm2/nic0"]}
	inv.changes <- struct{}{}
	if _, err := step(1.3e9); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Devs["sl-up0"].Classes[MakeHandle(1, 0x100)]; ok {
		t.Error("vm1 stopped but its class 1:100 is still there")
	}
	if k.Devs["sl-v0n0"].VNICClass != 0 {
		t.Error("vm1 stopped but its tap still has sluice's classifier")
	}
	if _, ok := a.ports["sl-up0|vm1/nic0"]; ok {
		t.Error("vm1's history is kept after it stopped")
	}
}

// TestRunTakesPolicies: a new policy takes effect at the next step; one
// that does not name the host is refused and the last good one kept; one
// without an uplink gives that uplink its root qdisc back.
func TestRunTakesPolicies(t *testing.T) {
	p := mustPolicy(t, followPolicy)
	k := NewFakeKernel("sl-up0", "sl-up1", "sl-v0n0", "sl-v1n0")
	inv := testInventory(p, "h1")
	inv.Devices["up1"] = "sl-up1"
	pols := make(chan *policy.Policy)
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true, Policies: pols})
	if err != nil {
		t.Fatal(err)
	}
	step, cancel := runAgent(t, a)
	defer cancel()

	pols <- mustPolicy(t, strings.Replace(followPolicy, "limit: 200Mbps", "limit: 50Mbps", 1))
	if _, err := step(1.1e9); err != nil {
		t.Fatal(err)
	}
	if c := k.Devs["sl-up0"].Classes[MakeHandle(1, 0x101)]; c == nil || c.CeilBps > 55e6 {
		t.Errorf("vm2's class after the new limit of 50Mbps: %+v", c)
	}

	pols <- mustPolicy(t, strings.Replace(followPolicy, "h1", "h9", -1))
	_, err = step(1.2e9)
	if err == nil || !strings.Contains(err.Error(), "keeping the last good one") || !strings.Contains(err.Error(), `host "h1" is not in the policy`) {
		t.Errorf("a policy without the host: error %v", err)
	}
	if a.Policy().Hosts[0].Name != "h1" {
		t.Error("the agent took a policy without its host")
	}

	// A second uplink, then none: sl-up1 is shaped, then given back.
	two := strings.Replace(followPolicy, "[{name: up0, speed: 1Gbps}]", "[{name: up0, speed: 1Gbps}, {name: up1, speed: 1Gbps}]", 1)
	pols <- mustPolicy(t, two)
	if _, err := step(1.3e9); err != nil {
		t.Fatal(err)
	}
	if !k.Devs["sl-up1"].HTB {
		t.Fatal("the new uplink up1 has no HTB")
	}
	pols <- mustPolicy(t, followPolicy)
	if _, err := step(1.4e9); err != nil {
		t.Fatal(err)
	}
	if q, _ := k.RootQdisc("sl-up1"); q.IsSluice() {
		t.Error("uplink up1 left the policy but keeps sluice's HTB")
	}
	if _, ok := a.Record().Uplinks["sl-up1"]; ok {
		t.Error("the record still holds the given-back uplink")
	}
	if !k.Devs["sl-up0"].HTB {
		t.Error("up0 lost its HTB")
	}
}

// TestUnnamedVMGetsItsClass: a running VM that the policy does not name
// gets, per vNIC, a class of its own with the policy's unnamedVMs setting
// and a classifier at its tap, from the step after it starts; the class
// and classifier go when it stops.
func TestUnnamedVMGetsItsClass(t *testing.T) {
	p := mustPolicy(t, followPolicy+"unnamedVMs: {shares: low, reservation: 50Mbps, limit: 300Mbps}\n")
	full := testInventory(p, "h1")
	inv := &changingInventory{StaticInventory: &StaticInventory{Running: []string{"vm1", "vm2"}, Devices: full.Devices,
		VNICs: full.VNICs}, changes: make(chan struct{})}
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "vnet7")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	step, cancel := runAgent(t, a)
	defer cancel()

	inv.Unnamed = []UnnamedVM{{Name: "stranger", NICs: []string{"vnet7"}}}
	inv.VNICs = map[string]VNICMatch{"stranger/vnet7": {Index: 9, HostDev: "vnet7"}}
	for port, m := range full.VNICs {
		inv.VNICs[port] = m
	}
	inv.changes <- struct{}{}
	s, err := step(1.1e9)
	if err != nil {
		t.Fatal(err)
	}
	id := MakeHandle(1, 0x100+9)
	c, ok := k.Devs["sl-up0"].Classes[id]
	if !ok {
		t.Fatalf("the unnamed VM's vNIC has no class %s", id)
	}
	if c.Parent != MakeHandle(1, classMinorBase+1) {
		t.Errorf("its class's parent is %s, want the vm class 1:11", c.Parent)
	}
	if c.CeilBps > 330e6 || c.CeilBps < 300e6 {
		t.Errorf("its ceil is %d, want unnamedVMs' 300Mbps limit on the wire", c.CeilBps)
	}
	if k.Devs["vnet7"].VNICClass != id {
		t.Errorf("its tap classifies into %s, want %s", k.Devs["vnet7"].VNICClass, id)
	}
	var port *PortStat
	for i, ps := range s.Uplinks[0].Ports {
		if ps.Port == "stranger/vnet7" {
			port = &s.Uplinks[0].Ports[i]
		}
	}
	if port == nil || port.Class != "vm" {
		t.Fatalf("stats have no vm port stranger/vnet7: %+v", s.Uplinks[0].Ports)
	}
	if strings.Join(s.Unnamed, ",") != "stranger" {
		t.Errorf("stats list unnamed VMs %v, want stranger", s.Unnamed)
	}
	// The vm class reserves the policy's vNICs' 100Mbps and its 50Mbps.
	ent := a.Trees()[0].Entitlements(map[string]float64{"vm1/nic0": 0, "vm2/nic0": 0, "stranger/vnet7": 1e9})
	if ent["stranger/vnet7"] != 300e6 {
		t.Errorf("alone on the uplink it is entitled to %v, want its 300Mbps limit", ent["stranger/vnet7"])
	}
	if r := a.Trees()[0].Classes[1].R; r != 150e6 {
		t.Errorf("the vm class reserves %v, want 150Mbps", r)
	}

	inv.Unnamed = nil
	delete(inv.VNICs, "stranger/vnet7")
	inv.changes <- struct{}{}
	if _, err := step(1.2e9); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Devs["sl-up0"].Classes[id]; ok {
		t.Error("the unnamed VM stopped but its class is still there")
	}
	if k.Devs["vnet7"].VNICClass != 0 {
		t.Error("the unnamed VM stopped but its tap still has sluice's classifier")
	}
}

// TestMissingTapReportedAfterGrace: a vNIC whose device is gone (a VM's
// tap goes a moment before the inventory says the VM stopped) is not an
// error for VNICGoneGraceNs; after that it is, naming the device.
func TestMissingTapReportedAfterGrace(t *testing.T) {
	p := mustPolicy(t, followPolicy)
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(1e9); err != nil {
		t.Fatal(err)
	}
	delete(k.Devs, "sl-v1n0")
	if _, err := a.Step(1.1e9); err != nil {
		t.Errorf("the tap gone for 0 s: %v", err)
	}
	if _, err := a.Step(1.1e9 + VNICGoneGraceNs - 1); err != nil {
		t.Errorf("the tap gone for less than the grace: %v", err)
	}
	_, err = a.Step(1.1e9 + VNICGoneGraceNs)
	if err == nil || !strings.Contains(err.Error(), "sl-v1n0") {
		t.Errorf("the tap gone for the grace: error %v, want one naming sl-v1n0", err)
	}
}
