package cpuctl

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeTree writes the files of a cgroup group under root, as the kernel
// shows them.
func fakeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestV2ApplyAndStats applies settings to a fake cgroup2 tree twice (the
// second time writes nothing), reads its counters, and checks that a
// missing file is named in the error.
func TestV2ApplyAndStats(t *testing.T) {
	root, proc := t.TempDir(), t.TempDir()
	fakeTree(t, root, map[string]string{
		"machine.slice/vm1/cpu.weight":     "100\n",
		"machine.slice/vm1/cpu.max":        "max 100000\n",
		"machine.slice/vm1/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 10\nthrottled_usec 300000\n",
		"machine.slice/vm1/cpu.pressure":   "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"machine.slice/vm1/cgroup.threads": "101\n102\n",
	})
	fakeTree(t, proc, map[string]string{"101/schedstat": "900 4000 7\n", "102/schedstat": "100 500 2\n"})
	c := V2{Root: root, Proc: proc}
	s := Derive(HostCPU{Cores: 1, MHz: 1000}, []VM{{Name: "vm1", VCPUs: 1, Shares: 1000, ReservationMHz: 700, LimitMHz: 800, DemandMHz: Inf}, {Name: "vm2", VCPUs: 1, Shares: 1000, DemandMHz: Inf}})[0]
	w, err := c.Apply("machine.slice/vm1", s)
	if err != nil || !reflect.DeepEqual(w, []string{"cpu.weight", "cpu.max"}) {
		t.Fatalf("first apply: wrote %v, %v", w, err)
	}
	if got := read(t, filepath.Join(root, "machine.slice/vm1/cpu.weight")); got != "7000" {
		t.Errorf("cpu.weight %q, want 7000", got)
	}
	if got := read(t, filepath.Join(root, "machine.slice/vm1/cpu.max")); got != "80000 100000" {
		t.Errorf("cpu.max %q, want \"80000 100000\"", got)
	}
	if w, err := c.Apply("machine.slice/vm1", s); err != nil || len(w) != 0 {
		t.Errorf("second apply wrote %v, %v; want nothing", w, err)
	}
	st, err := c.Stats("machine.slice/vm1")
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{UsageNs: 2.5e9, NrPeriods: 40, NrThrottled: 10, ThrottledNs: 3e8, RunDelayNs: 4500, Threads: 2, PressureSomeUs: 123456, HasPressure: true}
	if st != want {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
	if _, err := c.Apply("machine.slice/vm2", s); err == nil || !strings.Contains(err.Error(), "machine.slice/vm2/cpu.weight") || !strings.Contains(err.Error(), "machine.slice/vm2/cpu.max") {
		t.Errorf("apply to a missing group: %v; want both files named", err)
	}
}

// TestV2Create enables the cpu controller in the parents' subtree_control.
func TestV2Create(t *testing.T) {
	root := t.TempDir()
	fakeTree(t, root, map[string]string{"cgroup.subtree_control": "memory\n"})
	c := V2{Root: root}
	if err := c.Create("sl-c1-vm1"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "cgroup.subtree_control")); got != "+cpu" {
		t.Errorf("subtree_control %q, want +cpu written", got)
	}
	if fi, err := os.Stat(filepath.Join(root, "sl-c1-vm1")); err != nil || !fi.IsDir() {
		t.Errorf("group not created: %v", err)
	}
}

// TestV1ApplyAndStats does the same for the legacy hierarchies, cpu and
// cpuacct mounted apart as on the lab machines.
func TestV1ApplyAndStats(t *testing.T) {
	cpu, acct, proc := t.TempDir(), t.TempDir(), t.TempDir()
	fakeTree(t, cpu, map[string]string{
		"sl-c1-vm1/cpu.shares":        "1024\n",
		"sl-c1-vm1/cpu.cfs_period_us": "100000\n",
		"sl-c1-vm1/cpu.cfs_quota_us":  "-1\n",
		"sl-c1-vm1/cpu.stat":          "nr_periods 5\nnr_throttled 2\nthrottled_time 7000000\nnr_bursts 0\nburst_time 0\n",
		"sl-c1-vm1/tasks":             "7\n",
	})
	fakeTree(t, acct, map[string]string{"sl-c1-vm1/cpuacct.usage": "999\n"})
	fakeTree(t, proc, map[string]string{"7/schedstat": "1 2 3\n"})
	c := V1{CPU: cpu, Acct: acct, Proc: proc}
	s := Setting{VM: "vm1", Weight: 3000, Shares: 30720, QuotaUs: 30000, PeriodUs: 100000}
	w, err := c.Apply("sl-c1-vm1", s)
	if err != nil || !reflect.DeepEqual(w, []string{"cpu.shares", "cpu.cfs_quota_us"}) {
		t.Fatalf("first apply: wrote %v, %v", w, err)
	}
	if w, err := c.Apply("sl-c1-vm1", s); err != nil || len(w) != 0 {
		t.Errorf("second apply wrote %v, %v; want nothing", w, err)
	}
	if got := read(t, filepath.Join(cpu, "sl-c1-vm1/cpu.cfs_quota_us")); got != "30000" {
		t.Errorf("quota %q", got)
	}
	st, err := c.Stats("sl-c1-vm1")
	want := Stats{UsageNs: 999, NrPeriods: 5, NrThrottled: 2, ThrottledNs: 7e6, RunDelayNs: 2, Threads: 1}
	if err != nil || st != want {
		t.Errorf("stats %+v, %v\nwant  %+v", st, err, want)
	}
	if _, err := c.Stats("sl-c1-vm2"); err == nil || !strings.Contains(err.Error(), "sl-c1-vm2/tasks") {
		t.Errorf("stats of a missing group: %v; want the file named", err)
	}
}

// TestV1LibvirtGroup: libvirt's group on this project's machines holds
// its threads in sub-groups (emulator, vcpu0) and exists in the cpu
// hierarchy only; the stats count the sub-groups' threads and take the
// usage from their schedstat.
func TestV1LibvirtGroup(t *testing.T) {
	cpu, acct, proc := t.TempDir(), t.TempDir(), t.TempDir()
	g := "machine/qemu-1-vm1.libvirt-qemu"
	fakeTree(t, cpu, map[string]string{
		g + "/cpu.stat":         "nr_periods 5\nnr_throttled 2\nthrottled_time 7000000\n",
		g + "/tasks":            "",
		g + "/emulator/tasks":   "10\n11\n",
		g + "/vcpu0/tasks":      "12\n",
		g + "/vcpu0/cpu.shares": "1024\n",
		"machine/other/tasks":   "99\n",
	})
	fakeTree(t, proc, map[string]string{"10/schedstat": "100 1 1\n", "11/schedstat": "200 2 1\n", "12/schedstat": "4000 30 9\n", "99/schedstat": "5 5 5\n"})
	st, err := V1{CPU: cpu, Acct: acct, Proc: proc}.Stats(g)
	want := Stats{UsageNs: 4300, NrPeriods: 5, NrThrottled: 2, ThrottledNs: 7e6, RunDelayNs: 33, Threads: 3}
	if err != nil || st != want {
		t.Errorf("stats %+v, %v\nwant  %+v", st, err, want)
	}
}

// TestFake: the fake reconciles and renders its state.
func TestFake(t *testing.T) {
	f := NewFake()
	f.AddGroup("sl-c1-vm1")
	f.AddGroup("sl-c1-vm2")
	set := Derive(HostCPU{Cores: 1, MHz: 1000}, []VM{{Name: "vm1", VCPUs: 1, Shares: 1000, LimitMHz: 300, DemandMHz: Inf}, {Name: "vm2", VCPUs: 1, Shares: 1000, DemandMHz: Inf}})
	for i := 0; i < 2; i++ {
		for _, s := range set {
			if _, err := f.Apply("sl-c1-"+s.VM, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := `sl-c1-vm1 cpu.max="30000 100000" cpu.weight=3000
sl-c1-vm2 cpu.max="max 100000" cpu.weight=7000
writes 3
`
	if got := f.String(); got != want {
		t.Errorf("fake state:\n%s\nwant:\n%s", got, want)
	}
}

// TestRates turns two samples into per-interval figures.
func TestRates(t *testing.T) {
	a := Stats{UsageNs: 1e9, ThrottledNs: 0, RunDelayNs: 5e8, PressureSomeUs: 1e5, HasPressure: true}
	b := Stats{UsageNs: 1.7e9, NrThrottled: 3, ThrottledNs: 1e8, RunDelayNs: 4e8, PressureSomeUs: 4e5, HasPressure: true}
	got := b.Rates(a, 1e9)
	want := Rates{UsedCores: 0.7, ThrottledFrac: 0.1, NrThrottled: 3, ReadyPct: 0, PressurePct: 30, HasPressure: true}
	if got != want {
		t.Errorf("rates %+v\nwant  %+v", got, want)
	}
}

// TestDetect reads a mountinfo like this machine's: cgroup v1 with cpu and
// cpuacct apart, cgroup2 without the cpu controller.
func TestDetect(t *testing.T) {
	dir := t.TempDir()
	uni := filepath.Join(dir, "unified")
	fakeTree(t, uni, map[string]string{"cgroup.controllers": "\n"})
	mi := filepath.Join(dir, "mountinfo")
	fakeTree(t, dir, map[string]string{"mountinfo": `25 24 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / ` + uni + ` rw,relatime shared:9 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
28 25 0:25 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
`})
	tr, err := Detect(mi)
	want := V1{CPU: "/sys/fs/cgroup/cpu", Acct: "/sys/fs/cgroup/cpuacct", Unified: uni}
	if err != nil || tr != Tree(want) {
		t.Errorf("Detect: %#v, %v; want %#v", tr, err, want)
	}
	fakeTree(t, uni, map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"})
	if tr, err := Detect(mi); err != nil || tr != Tree(V2{Root: uni}) {
		t.Errorf("Detect with cpu in cgroup2: %#v, %v", tr, err)
	}
}
