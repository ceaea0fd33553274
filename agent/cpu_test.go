package agent

import (
	"strconv"
	"strings"
	"testing"

	"sluice/cpuctl"
)

// cpuPolicy: two cores of 1000 MHz; vm1 reserves 700 MHz, vm2 has twice
// vm3's shares, vm3 is limited to 300 MHz.
const cpuPolicy = `cluster: c
hosts: [{name: h1, cpu: {cores: 2, mhz: 1000}, uplinks: [{name: up0, speed: 1Gbps}]}]
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1, reservationMHz: 700}, nics: [{name: nic0}]}
  - {name: vm2, host: h1, cpu: {vcpus: 2, shares: high}, nics: [{name: nic0}]}
  - {name: vm3, host: h1, cpu: {vcpus: 1, limitMHz: 300}, nics: [{name: nic0}]}
`

func cpuAgent(t *testing.T, text string, dynamic bool) (*Agent, *StaticInventory, *cpuctl.Fake) {
	t.Helper()
	p := mustPolicy(t, text)
	inv := testInventory(p, "h1")
	inv.Cgroups = map[string]string{}
	f := cpuctl.NewFake()
	for _, vm := range inv.Running {
		inv.Cgroups[vm] = "sl-c-" + vm
		f.AddGroup("sl-c-" + vm)
	}
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "sl-v2n0")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: dynamic, Cgroups: f})
	if err != nil {
		t.Fatal(err)
	}
	return a, inv, f
}

func wantText(t *testing.T, what, got, want string) {
	t.Helper()
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("%s:\n%s\nwant:\n%s", what, got, want)
	}
}

func cpuTable(s Stats) string {
	var b strings.Builder
	for _, c := range s.CPU {
		b.WriteString(c.VM + " " + c.Cgroup + " " + c.Reason + " " + c.CPUMax + " ")
		b.WriteString(strings.Join([]string{ftoa(c.EntitlementMHz), "w" + ftoa(float64(c.Weight)), "s" + ftoa(float64(c.Shares)),
			"used" + ftoa(c.UsedPct), "thr" + ftoa(c.ThrottledPct), "rdy" + ftoa(c.ReadyPct)}, " "))
		b.WriteString("\n")
	}
	return b.String()
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// TestCPUApply: the first step sets every running VM's group, a second
// writes nothing, a VM that stops gets the kernel's defaults back and
// leaves the statistics, and a new policy changes the weights.
func TestCPUApply(t *testing.T) {
	a, inv, f := cpuAgent(t, cpuPolicy, false)
	ch, err := a.Step(1e9)
	if err != nil {
		t.Fatal(err)
	}
	// 2000 MHz, shares 1000:4000:1000 (normal per vCPU, high × 2 vCPUs):
	// vm1 700 (its reservation is more than its share of 333), vm2 and vm3
	// share the other 1300 4:1 (vm3 under its limit of 300).
	wantText(t, "groups after the first step", f.String(), `
sl-c-vm1 cpu.max="max 100000" cpu.weight=3500
sl-c-vm2 cpu.max="max 100000" cpu.weight=5200
sl-c-vm3 cpu.max="30000 100000" cpu.weight=1300
writes 4`)
	if ch.CPUFiles != 4 {
		t.Errorf("first step wrote %d cgroup files, want 4", ch.CPUFiles)
	}
	ch, err = a.Step(1.1e9)
	if err != nil || ch.CPUFiles != 0 || f.Writes != 4 {
		t.Errorf("second step: %v, %d files written (fake: %d writes), want none", err, ch.CPUFiles, f.Writes)
	}

	// vm3 stops: its group goes back to the defaults, the others share
	// its part.
	inv.Running = []string{"vm1", "vm2"}
	if err := a.Resync(); err != nil {
		t.Fatal(err)
	}
	ch, err = a.Step(1.2e9)
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "groups after vm3 stopped", f.String(), `
sl-c-vm1 cpu.max="max 100000" cpu.weight=3500
sl-c-vm2 cpu.max="max 100000" cpu.weight=6500
sl-c-vm3 cpu.max="max 100000" cpu.weight=100
writes 7`)
	if got := cpuTable(a.Stats()); strings.Contains(got, "vm3") {
		t.Errorf("vm3 stopped but is in the statistics:\n%s", got)
	}
	if ch, err = a.Step(1.3e9); err != nil || ch.CPUFiles != 0 {
		t.Errorf("step after the reset: %v, %d files written, want none", err, ch.CPUFiles)
	}

	// A new policy: vm1 gives up its reservation and gets vm2's shares.
	p2 := mustPolicy(t, strings.Replace(cpuPolicy, "vcpus: 1, reservationMHz: 700", "vcpus: 2, shares: high", 1))
	if err := a.SetPolicy(p2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(1.4e9); err != nil {
		t.Fatal(err)
	}
	wantText(t, "groups after the new policy", f.String(), `
sl-c-vm1 cpu.max="max 100000" cpu.weight=5000
sl-c-vm2 cpu.max="max 100000" cpu.weight=5000
sl-c-vm3 cpu.max="max 100000" cpu.weight=100
writes 9`)
}

// TestCPUStats: the statistics carry each VM's settings and its rates over
// the last interval; in dynamic mode an idle VM keeps the weight of its
// reservation (vm1) and an idle VM without one falls to its headroom.
func TestCPUStats(t *testing.T) {
	a, _, f := cpuAgent(t, cpuPolicy, true)
	if _, err := a.Step(1e9); err != nil {
		t.Fatal(err)
	}
	// Over 100 ms: vm1 idle, vm2 uses 1.5 cores and waits 10 ms for a
	// CPU, vm3 uses its 30 ms and is throttled for 70 ms.
	f.SetStats("sl-c-vm2", cpuctl.Stats{UsageNs: 150e6, RunDelayNs: 10e6})
	f.SetStats("sl-c-vm3", cpuctl.Stats{UsageNs: 30e6, NrPeriods: 1, NrThrottled: 1, ThrottledNs: 70e6})
	if _, err := a.Step(1.1e9); err != nil {
		t.Fatal(err)
	}
	wantText(t, "stats", cpuTable(a.Stats()), `
vm1 sl-c-vm1 demand max 100000 700 w3500 s35840 used0 thr0 rdy0
vm2 sl-c-vm2 shares max 100000 1040 w5200 s53248 used150 thr0 rdy10
vm3 sl-c-vm3 shares 30000 100000 260 w1300 s13312 used30 thr70 rdy0`)

	// vm2 goes idle and vm3 stays throttled: once vm2's busy interval is
	// out of the demand window, vm2 is entitled to its headroom only (2%
	// of a core) and vm3 to its limit; vm1 keeps its reservation.
	f.SetStats("sl-c-vm3", cpuctl.Stats{UsageNs: 60e6, NrPeriods: 2, NrThrottled: 2, ThrottledNs: 140e6})
	if _, err := a.Step(1.2e9); err != nil {
		t.Fatal(err)
	}
	f.SetStats("sl-c-vm3", cpuctl.Stats{UsageNs: 90e6 + 1000e6*3/10, NrPeriods: 13, NrThrottled: 13, ThrottledNs: 910e6})
	if _, err := a.Step(2.2e9); err != nil {
		t.Fatal(err)
	}
	wantText(t, "stats after vm2 idled", cpuTable(a.Stats()), `
vm1 sl-c-vm1 demand max 100000 700 w3500 s35840 used0 thr0 rdy0
vm2 sl-c-vm2 demand max 100000 20 w100 s1024 used0 thr0 rdy0
vm3 sl-c-vm3 limit 30000 100000 300 w1500 s15360 used33 thr77 rdy0`)
	if s := a.Stats(); s.CPUCapacityMHz != 2000 || s.CPU[1].DemandMHz != 20 || s.CPU[2].DemandMHz != -1 {
		t.Errorf("capacity %g MHz, demands %g and %g; want 2000, 20 and -1 (unbounded)", s.CPUCapacityMHz, s.CPU[1].DemandMHz, s.CPU[2].DemandMHz)
	}
}
