package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/policy"
)

func TestDstPortKeys(t *testing.T) {
	for _, c := range []struct {
		r    PortRange
		want string
	}{
		{PortRange{2049, 2049}, "0801/ffff"},
		{PortRange{49152, 49215}, "c000/ffc0"},
		{PortRange{6800, 7300}, "1a90/fff0 1aa0/ffe0 1ac0/ffc0 1b00/ff00 1c00/ff80 1c80/fffc 1c84/ffff"},
		{PortRange{0, 65535}, "0000/0000"},
	} {
		var got []string
		covered := map[uint32]bool{}
		for _, k := range dstPortKeys(c.r) {
			got = append(got, fmt.Sprintf("%04x/%04x", k.Val, k.Mask))
			for p := uint32(0); p < 1<<16; p++ {
				if p&k.Mask == k.Val {
					covered[p] = true
				}
			}
		}
		if s := strings.Join(got, " "); s != c.want {
			t.Errorf("%v: %s, want %s", c.r, s, c.want)
		}
		// The blocks cover the range and nothing else.
		for p := uint32(0); p < 1<<16; p++ {
			if in := p >= uint32(c.r.First) && p <= uint32(c.r.Last); covered[p] != in {
				t.Errorf("%v: port %d covered %v", c.r, p, covered[p])
			}
		}
	}
}

const installPolicy = `cluster: t
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
trafficClasses: {vm: {shares: normal}, vmotion: {shares: normal}}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0}]}
  - {name: vm2, host: h1, nics: [{name: nic0}]}
`

func installAgent(t *testing.T, k *FakeKernel, record string, ports map[string][]PortRange) *Agent {
	t.Helper()
	p, err := policy.Parse("t.yaml", []byte(installPolicy))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), Dynamic: true, RecordPath: record, ClassPorts: ports})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestInstallUninstall: the agent records the uplink's root before its
// first change; Uninstall gives it back exactly and removes the
// classifiers (clsact too, unless others' filters are on it); a second
// Uninstall does nothing; without the record the inventory's devices are
// still cleaned.
func TestInstallUninstall(t *testing.T) {
	tbf := Qdisc{Kind: "tbf", Handle: "8001:0", Options: json.RawMessage(`{"Rate":125000}`)}
	for _, root := range []Qdisc{{}, tbf, {Kind: "mq", Handle: "0:0", Default: true}} {
		k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
		k.Devs["sl-up0"].Root = root
		k.Devs["sl-v1n0"].Clsact, k.Devs["sl-v1n0"].OtherFilters = true, 1
		before := k.String()
		record := t.TempDir() + "/state.json"
		a := installAgent(t, k, record, nil)
		if _, err := a.Step(1e9); err != nil {
			t.Fatal(err)
		}
		rec, err := ReadRecord(record)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Uplinks["sl-up0"].Kind != map[bool]string{true: "noqueue", false: root.Kind}[root.Kind == ""] || strings.Join(rec.VNICs, " ") != "sl-v0n0 sl-v1n0" {
			t.Errorf("root %v: record %+v", root, rec)
		}
		done, err := Uninstall(k, rec, UninstallOptions{}, []string{"sl-up0"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("root %s: %s", root.Kind, strings.Join(done, "; "))
		if got := k.String(); got != before {
			t.Errorf("root %v: after uninstall\n%s\nwant\n%s", root, got, before)
		}
		w := k.Writes
		if done, err := Uninstall(k, rec, UninstallOptions{}, []string{"sl-up0"}, []string{"sl-v0n0"}); err != nil || len(done) != 0 || k.Writes != w {
			t.Errorf("second uninstall: %v %v, %d writes", done, err, k.Writes-w)
		}
	}
	// A lost state file: without the roots directory the uplink's root is
	// unknown, which is an error (sluice's HTB stays), and the vNICs are
	// cleaned; with --kernel-default the kernel's default comes back.
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	if _, err := installAgent(t, k, "", nil).Step(1e9); err != nil {
		t.Fatal(err)
	}
	_, err := Uninstall(k, nil, UninstallOptions{}, []string{"sl-up0"}, []string{"sl-v0n0", "sl-v1n0"})
	if !errors.Is(err, ErrRootUnknown) {
		t.Errorf("uninstall without a record: %v, want %v", err, ErrRootUnknown)
	}
	if q, _ := k.RootQdisc("sl-up0"); !q.IsSluice() {
		t.Errorf("uninstall without a record replaced sluice's root by %+v", q)
	}
	if _, err := Uninstall(k, nil, UninstallOptions{KernelDefault: true}, []string{"sl-up0"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := k.String(); got != "sl-up0: default qdisc\nsl-v0n0: default qdisc\nsl-v1n0: default qdisc\n" {
		t.Errorf("uninstall without a record left:\n%s", got)
	}
}

// TestRootsDir: the agent keeps the root it replaced in the roots
// directory too, so that Uninstall without the state file (another
// --state-dir) gives it back and forgets it; an agent started with
// another state file over sluice's root takes the root from there rather
// than recording the kernel's default.
func TestRootsDir(t *testing.T) {
	tbf := Qdisc{Kind: "tbf", Handle: "8001:0", Raw: true, TCAOptions: []byte{1, 2, 3}}
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	k.Devs["sl-up0"].Root = tbf
	before := k.String()
	roots := t.TempDir()
	p, err := policy.Parse("t.yaml", []byte(installPolicy))
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{t.TempDir() + "/a.json", t.TempDir() + "/b.json"} {
		a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), Dynamic: true, RecordPath: state, RootsDir: roots})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Step(1e9); err != nil {
			t.Fatal(err)
		}
		rec, err := ReadRecord(state)
		if err != nil {
			t.Fatal(err)
		}
		if q := rec.Uplinks["sl-up0"]; q.Kind != "tbf" || !q.Raw {
			t.Errorf("state %s: recorded %+v", state, q)
		}
	}
	done, err := Uninstall(k, nil, UninstallOptions{RootsDir: roots}, []string{"sl-up0"}, []string{"sl-v0n0", "sl-v1n0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(strings.Join(done, "; "))
	if got := k.String(); got != before {
		t.Errorf("after uninstall\n%s\nwant\n%s", got, before)
	}
	if left, _ := os.ReadDir(roots); len(left) != 0 {
		t.Errorf("the roots directory keeps %v", left)
	}
}

// TestInstallRefusals: an Open vSwitch port and a root sluice could not
// give back (filters on it) are refused before any change.
func TestInstallRefusals(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	k.Devs["sl-up0"].Master = "openvswitch"
	ch, err := installAgent(t, k, "", nil).Step(1e9)
	if err == nil || !strings.Contains(err.Error(), "Open vSwitch") || ch.Total() != 0 || k.Writes != 0 {
		t.Errorf("OVS port: %v, %s", err, ch)
	}
	k = NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	k.Devs["sl-up0"].Root = Qdisc{Kind: "prio", Handle: "5:0", Raw: true, Unrestorable: "filters are attached to it"}
	ch, err = installAgent(t, k, "", nil).Step(1e9)
	if err == nil || !strings.Contains(err.Error(), "filters are attached to it, which sluice cannot record") || ch.Total() != 0 || k.Writes != 0 {
		t.Errorf("prio root with filters: %v, %s", err, ch)
	}
}

// TestClassPorts: the host-level port filters follow Config.ClassPorts;
// too many blocks for one class is an error.
func TestClassPorts(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	a := installAgent(t, k, "", map[string][]PortRange{"vmotion": {{8000, 8000}}})
	var got []string
	for _, f := range a.Trees()[0].Filters {
		if len(f.Keys) == 2 && f.Keys[1].Off == 20 {
			got = append(got, fmt.Sprintf("%s:%d", f.ClassID, f.Keys[1].Val))
		}
	}
	if s := strings.Join(got, " "); s != "1:15:8000" {
		t.Errorf("port filters %s, want 1:15:8000 only", s)
	}
	p, _ := policy.Parse("t.yaml", []byte(installPolicy))
	var many []PortRange
	for i := range 40 {
		many = append(many, PortRange{uint16(1000 + 2*i), uint16(1000 + 2*i)})
	}
	if _, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), ClassPorts: map[string][]PortRange{"vmotion": many}}); err == nil || !strings.Contains(err.Error(), "at most 32") {
		t.Errorf("40 ports: %v", err)
	}
}

// TestRecordWrittenFirst: the state file names the uplink's original root
// before the root is replaced (a crash between the two loses nothing).
func TestRecordWrittenFirst(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0")
	record := t.TempDir() + "/state.json"
	a := installAgent(t, k, record, nil)
	if err := a.takeUplink("sl-up0"); err != nil {
		t.Fatal(err)
	}
	if k.Writes != 0 {
		t.Fatal("takeUplink wrote to the kernel")
	}
	b, err := os.ReadFile(record)
	if err != nil || !strings.Contains(string(b), `"noqueue"`) {
		t.Errorf("state file before the first change: %s %v", b, err)
	}
}

// TestForgetNetnsRoots: deleting a namespace forgets the roots recorded
// for its devices, and only those.
func TestForgetNetnsRoots(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"netns11-if3-sl-up0", "netns11-if4-sl-up1", "netns111-if3-sl-up0"} {
		if err := writeRootRecord(dir, Qdisc{Kind: "tbf", Handle: "8001:0", Raw: true, Device: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ForgetNetnsRoots(dir, 11); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) != 1 || filepath.Base(left[0]) != "netns111-if3-sl-up0.json" {
		t.Errorf("left %v", left)
	}
}
