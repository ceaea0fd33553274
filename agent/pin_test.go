package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/cpuctl"
)

// pinPolicy: 4 cores, core 0 kept for the host; lat (2 vCPUs) is
// latency-sensitive, bulk is not.
const pinPolicy = `cluster: c
hosts: [{name: h1, cpu: {cores: 4, mhz: 1000}, uplinks: [{name: up0, speed: 1Gbps}]}]
vms:
  - {name: lat, host: h1, latency: sensitive, cpu: {vcpus: 2}, nics: [{name: nic0, reservation: 100Mbps}]}
  - {name: bulk, host: h1, cpu: {vcpus: 2}, nics: [{name: nic0}]}
`

func pinAgent(t *testing.T, text string) (*Agent, *StaticInventory, *FakePinner, string) {
	t.Helper()
	p := mustPolicy(t, text)
	inv := testInventory(p, "h1")
	inv.Cgroups = map[string]string{}
	f := cpuctl.NewFake()
	pr := NewFakePinner(4)
	for _, vm := range inv.Running {
		inv.Cgroups[vm] = "sl-c-" + vm
		f.AddGroup("sl-c-" + vm)
		pr.Start(vm, p.VM(vm).CPU.VCPUs)
	}
	path := filepath.Join(t.TempDir(), "pins.json")
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Cgroups: f, Pinner: pr, PinsPath: path})
	if err != nil {
		t.Fatal(err)
	}
	return a, inv, pr, path
}

// TestPins: the sensitive VM's vCPUs go to cores 1 and 2, the other VM's
// vCPUs and every emulator to cores 0 and 3; the originals are recorded
// before the first write; a second step writes nothing; a domain not
// running is skipped and pinned when it starts; a policy without a
// sensitive VM gives the originals back; uninstall gives them back after
// a crash.
func TestPins(t *testing.T) {
	a, inv, pr, path := pinAgent(t, pinPolicy)
	pr.Stop("bulk") // not running yet (the inventory still lists it)
	ch, err := a.Step(1e9)
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "after the first step", pr.String(), `
lat: 0:1 1:2 emulator:0,3
writes 3`)
	if ch.CPUPins != 3 {
		t.Errorf("CPUPins %d, want 3", ch.CPUPins)
	}
	st := a.Stats()
	if st.CPU[0].Cores != "1-2" || st.CPU[0].Reason != "pinned" || st.CPU[0].EntitlementMHz != 2000 || st.CPU[1].Cores != "" {
		t.Errorf("stats: %+v", st.CPU)
	}
	orig, err := readOriginals[DomainPins](path)
	if err != nil || len(orig) != 1 || orig["lat"].String() != "0:0-3 1:0-3 emulator:0-3" {
		t.Errorf("originals recorded: %v, %v", orig, err)
	}
	// Read back after PinRecheckNs: nothing to write.
	if ch, err := a.Step(1e9 + PinRecheckNs); err != nil || ch.CPUPins != 0 {
		t.Errorf("second step: %v, %v", ch, err)
	}
	// bulk starts: pinned at the next step (the decision is the same, so
	// at the recheck).
	pr.Start("bulk", 2)
	if _, err := a.Step(1e9 + 2*PinRecheckNs); err != nil {
		t.Fatal(err)
	}
	wantText(t, "bulk started", pr.String(), `
bulk: 0:0,3 1:0,3 emulator:0,3
lat: 0:1 1:2 emulator:0,3
writes 6`)
	// A change behind the agent's back is undone at the recheck.
	if err := pr.PinVCPU("lat", 0, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Step(1e9 + 3*PinRecheckNs); err != nil || ch.CPUPins != 1 || !strings.Contains(pr.String(), "lat: 0:1 1:2") {
		t.Errorf("repinned: %v, %v\n%s", ch, err, pr)
	}
	// lat is no longer sensitive: everything is given back at once (8
	// writes so far, the test's own included).
	if err := a.SetPolicy(mustPolicy(t, strings.Replace(pinPolicy, "latency: sensitive, ", "", 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(1e9 + 3*PinRecheckNs + 1); err != nil {
		t.Fatal(err)
	}
	wantText(t, "given back", pr.String(), `
bulk: 0:0-3 1:0-3 emulator:0-3
lat: 0:0-3 1:0-3 emulator:0-3
writes 14`)
	if orig, _ := readOriginals[DomainPins](path); len(orig) != 0 {
		t.Errorf("originals left: %v", orig)
	}
	_ = inv
}

// TestUninstallPins: after a crash (the agent gone), uninstall gives the
// running domains their recorded pinning back, skips one that stopped and
// one that started again, and removes the file.
func TestUninstallPins(t *testing.T) {
	a, _, pr, path := pinAgent(t, pinPolicy)
	if _, err := a.Step(1e9); err != nil {
		t.Fatal(err)
	}
	pr.Start("other", 1) // started again: its own pinning
	orig, _ := readOriginals[DomainPins](path)
	orig["other"] = DomainPins{ID: 99, VCPUs: [][]int{{3}}, Emulator: []int{3}}
	orig["gone"] = DomainPins{ID: 7, VCPUs: [][]int{{0}}}
	if err := writePins(path, orig); err != nil {
		t.Fatal(err)
	}
	done, err := UninstallPins(pr, path)
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "uninstall", strings.Join(done, "\n"), `
pins bulk: given back (0:0-3 1:0-3 emulator:0-3)
pins gone: not running, nothing to give back
pins lat: given back (0:0-3 1:0-3 emulator:0-3)
pins other: started again since, it has its own pinning`)
	wantText(t, "domains", pr.String(), `
bulk: 0:0-3 1:0-3 emulator:0-3
lat: 0:0-3 1:0-3 emulator:0-3
other: 0:0-3 emulator:0-3
writes 12`)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("originals file left: %v", err)
	}
}

// TestPinsFailure: a failed pin is reported, not fatal; the other
// domains are pinned and the step's other work is done.
func TestPinsFailure(t *testing.T) {
	a, _, pr, _ := pinAgent(t, pinPolicy)
	pr.Fail["bulk"] = errors.New("permission denied")
	ch, err := a.Step(1e9)
	if err == nil || !strings.Contains(err.Error(), "pin bulk vCPU 0 to 0,3: permission denied") {
		t.Errorf("error %v", err)
	}
	if ch.CPUFiles == 0 || !strings.Contains(pr.String(), "lat: 0:1 1:2 emulator:0,3") {
		t.Errorf("the rest not done: %v\n%s", ch, pr)
	}
	// Retried at the next step, not only at the recheck.
	delete(pr.Fail, "bulk")
	if ch, err := a.Step(1.1e9); err != nil || ch.CPUPins != 3 {
		t.Errorf("retry: %v, %v", ch, err)
	}
}
