// Package pinlive tests the agent's pinning of latency-sensitive VMs
// (issue 27) on the machine's real libvirtd: two bare QEMU domains, one
// latency-sensitive, on a host of 2 cores whose core 0 is kept for the
// host. It needs root and libvirtd (scripts/deps.sh starts it); a missing
// piece fails the test with its reason. Its domains are named sl-pl…-
// and destroyed when it ends, also when it fails.
package pinlive

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/agent"
	"sluice/cpuctl"
	"sluice/livetest/livelab"
	"sluice/policy"
	"sluice/virt"
)

// pinLibvirt is this machine's libvirtd, which must have the 2 CPUs that
// one core kept for the host and one pinned to a VM need.
func pinLibvirt(t *testing.T) *virt.Libvirt {
	t.Helper()
	c := livelab.Libvirt(t, "virsh")
	_, _, cpus, _, _, _, _, _, err := c.Client().NodeGetInfo()
	if err != nil {
		t.Fatalf("NodeGetInfo: %v", err)
	}
	if cpus < 2 {
		t.Fatalf("the host has %d CPUs: pinning one core of its own next to the host's core 0 needs 2", cpus)
	}
	return c
}

// virshVCPUPin is `virsh vcpupin DOMAIN` as a map vCPU → CPU list ("1",
// "0-1"): what an operator sees.
func virshVCPUPin(t *testing.T, dom string) map[int]string {
	t.Helper()
	out, err := exec.Command("virsh", "-c", "qemu:///system", "vcpupin", dom).CombinedOutput()
	if err != nil {
		t.Fatalf("virsh vcpupin %s: %v: %s", dom, err, out)
	}
	m := map[int]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if i, err := strconv.Atoi(f[0]); err == nil {
			m[i] = f[1]
		}
	}
	return m
}

// vcpuAffinity is the kernel's CPU affinity of the domain's vCPU 0 thread
// (QEMU names it "CPU 0/TCG" or "CPU 0/KVM"): Cpus_allowed_list in its
// /proc status.
func vcpuAffinity(t *testing.T, dom string) string {
	t.Helper()
	pid, err := os.ReadFile("/run/libvirt/qemu/" + dom + ".pid")
	if err != nil {
		t.Fatalf("QEMU's pid of %s: %v", dom, err)
	}
	dir := "/proc/" + strings.TrimSpace(string(pid)) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		comm, _ := os.ReadFile(filepath.Join(dir, task.Name(), "comm"))
		if !strings.HasPrefix(string(comm), "CPU 0/") {
			continue
		}
		st, err := os.ReadFile(filepath.Join(dir, task.Name(), "status"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	t.Fatalf("%s: no vCPU 0 thread in %s", dom, dir)
	return ""
}

// TestPinSensitive: the agent's step pins the latency-sensitive domain's
// vCPU to core 1 and keeps the other domain (its vCPU and both emulators)
// on core 0; a second step writes nothing; uninstall gives both their
// original pinning back, as libvirt and virsh report it.
func TestPinSensitive(t *testing.T) {
	c := pinLibvirt(t)
	prefix := "sl-pl" + livelab.RandHex(2)
	lat, oth := prefix+"-lat", prefix+"-oth"
	livelab.BareDomain(t, c, lat, 32, "")
	livelab.BareDomain(t, c, oth, 32, "")
	pr := c.Pinner()
	orig := map[string]agent.DomainPins{}
	origVirsh := map[string]map[int]string{}
	for _, d := range []string{lat, oth} {
		p, err := pr.Pins(d)
		if err != nil {
			t.Fatal(err)
		}
		orig[d], origVirsh[d] = p, virshVCPUPin(t, d)
		t.Logf("%s before: %s (virsh vcpupin %v)", d, p, origVirsh[d])
	}
	text := fmt.Sprintf(`cluster: pl
hosts: [{name: h1, cpu: {cores: 2, mhz: 1000}}]
vms:
  - {name: %s, host: h1, latency: sensitive}
  - {name: %s, host: h1}
`, lat, oth)
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Host("h1").CPU.HostCores; got != 1 {
		t.Fatalf("hostCores %d, want the default 1", got)
	}
	inv := &agent.StaticInventory{Running: []string{lat, oth}, Cgroups: map[string]string{lat: "sl-pl-lat", oth: "sl-pl-oth"}}
	cg := cpuctl.NewFake() // the cgroups are not the subject here
	cg.AddGroup("sl-pl-lat")
	cg.AddGroup("sl-pl-oth")
	path := agent.PinsOriginalsPath(t.TempDir(), p.Cluster, "h1")
	a, err := agent.New(agent.Config{Policy: p, Host: "h1", Kernel: agent.NewFakeKernel(), Inventory: inv, Cgroups: cg, Pinner: pr, PinsPath: path})
	if err != nil {
		t.Fatal(err)
	}
	// Uninstall runs also when the test fails half-way.
	t.Cleanup(func() {
		if _, err := os.Stat(path); err == nil {
			if _, err := agent.UninstallPins(pr, path); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	start := time.Now()
	ch, err := a.Step(agent.NowNs())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first step: %s in %s", ch, took.Round(time.Millisecond))
	want := map[string]agent.DomainPins{
		lat: {VCPUs: [][]int{{1}}, Emulator: []int{0}},
		oth: {VCPUs: [][]int{{0}}, Emulator: []int{0}},
	}
	wantVirsh := map[string]string{lat: "1", oth: "0"}
	for _, d := range []string{lat, oth} {
		got, err := pr.Pins(d)
		if err != nil {
			t.Fatal(err)
		}
		w := want[d]
		if !slices.EqualFunc(got.VCPUs, w.VCPUs, slices.Equal) || !slices.Equal(got.Emulator, w.Emulator) {
			t.Errorf("%s pinned: libvirt reports %s, want vCPU 0 on %v and the emulator on %v", d, got, w.VCPUs[0], w.Emulator)
		}
		v := virshVCPUPin(t, d)
		if v[0] != wantVirsh[d] {
			t.Errorf("%s pinned: virsh vcpupin shows vCPU 0 on %q, want %q", d, v[0], wantVirsh[d])
		}
		aff := vcpuAffinity(t, d)
		if aff != wantVirsh[d] {
			t.Errorf("%s pinned: its vCPU 0 thread may run on CPUs %q (Cpus_allowed_list), want %q", d, aff, wantVirsh[d])
		}
		t.Logf("%s after the step: %s (virsh vcpupin %v, vCPU thread Cpus_allowed_list %s)", d, got, v, aff)
	}
	if st := a.Stats(); len(st.CPU) != 2 || st.CPU[0].Cores != "1" || st.CPU[0].Reason != "pinned" {
		t.Errorf("agent stats: %+v", st.CPU)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("originals not recorded: %v", err)
	}
	// Idempotent: read back at the recheck, nothing written.
	ch, err = a.Step(agent.NowNs() + agent.PinRecheckNs)
	if err != nil || ch.CPUPins != 0 {
		t.Errorf("second step: %s, %v; want no pinning written", ch, err)
	}
	done, err := agent.UninstallPins(pr, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uninstall: %s", strings.Join(done, "; "))
	for _, d := range []string{lat, oth} {
		got, err := pr.Pins(d)
		if err != nil {
			t.Fatal(err)
		}
		o := orig[d]
		if !slices.EqualFunc(got.VCPUs, o.VCPUs, slices.Equal) || !slices.Equal(got.Emulator, o.Emulator) {
			t.Errorf("%s after uninstall: %s, want the original %s", d, got, o)
		}
		if v := virshVCPUPin(t, d); v[0] != origVirsh[d][0] {
			t.Errorf("%s after uninstall: virsh vcpupin shows %q, want the original %q", d, v[0], origVirsh[d][0])
		}
		if aff := vcpuAffinity(t, d); aff != origVirsh[d][0] {
			t.Errorf("%s after uninstall: its vCPU 0 thread may run on %q, want the original %q", d, aff, origVirsh[d][0])
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("originals file left after uninstall: %v", err)
	}
}
