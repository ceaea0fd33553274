package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/policy"
)

// vfInventory is a StaticInventory whose passthrough vNICs are VFs.
type vfInventory struct {
	*StaticInventory
	vfs map[string]VF // port → VF; absent: not found
}

func (v *vfInventory) VF(port string) (VF, error) {
	if f, ok := v.vfs[port]; ok {
		return f, nil
	}
	return VF{}, fmt.Errorf("%s: no interface type='hostdev'", port)
}

// TestVFDataDriven runs testdata/vf.txt against the fake netlink
// (FakeVF). Commands:
//
//	policy                       the policy (input); a new agent on h1 with PF pf0=N VFs
//	kernel pf=N ... [set=PF/I:MIN/MAX ...]  the fake PFs and their rates before sluice;
//	                             again: rates changed by hand
//	vf PORT=PF/INDEX | PORT=-    where the inventory finds a port's VF (- : not found)
//	run vms=(a,b)                the VMs that run; one step; prints changes, status, kernel
//	setpolicy                    a new policy (input) for the running agent; one step
//	uninstall                    sluice agent uninstall's VF part; prints its lines and the kernel
//
// After each step the harness checks from the outside: every found VF of
// a running VM has its policy's rates, every VF of no running VM has the
// rates it had before sluice.
func TestVFDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/vf", func(t *testing.T, path string) {
		var (
			p      *policy.Policy
			k      *FakeVF
			inv    *vfInventory
			a      *Agent
			before map[string]VFRate
			orig   = filepath.Join(t.TempDir(), "vf-originals.json")
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "kernel":
				// The first one makes the PFs and what they had before
				// sluice; a later one changes rates by hand.
				first := k == nil
				if first {
					k = NewFakeVF()
					before = map[string]VFRate{}
				}
				for _, arg := range d.CmdArgs {
					if arg.Key == "set" {
						for _, v := range arg.Vals {
							var pf string
							var i int
							var r VFRate
							key, rates, _ := strings.Cut(v, ":")
							pf, idx, _ := strings.Cut(key, "/")
							fmt.Sscan(idx, &i)
							fmt.Sscanf(rates, "%d/%d", &r.MinTxMbps, &r.MaxTxMbps)
							k.PFs[pf][i] = r
						}
						continue
					}
					if first {
						var n int
						fmt.Sscan(arg.Vals[0], &n)
						k.PFs[arg.Key] = make([]VFRate, n)
					}
				}
				for pf, vfs := range k.PFs {
					for i, r := range vfs {
						if first {
							before[vfKey(pf, i)] = r
						}
					}
				}
				return k.String()
			case "policy", "setpolicy":
				var err error
				if p, err = policy.Parse("vf.yaml", []byte(d.Input)); err != nil {
					return "error: " + err.Error() + "\n"
				}
				if d.Cmd == "setpolicy" {
					if err := a.SetPolicy(p); err != nil {
						return "error: " + err.Error() + "\n"
					}
					return step(t, a, k, inv, p, before)
				}
				inv = &vfInventory{StaticInventory: &StaticInventory{Devices: map[string]string{}, VNICs: map[string]VNICMatch{}}, vfs: map[string]VF{}}
				for _, h := range p.Hosts {
					for _, u := range h.Uplinks {
						inv.Devices[u.Name] = "dev-" + u.Name
					}
				}
				return "ok\n"
			case "vf":
				for _, arg := range d.CmdArgs {
					if arg.Vals == nil || arg.Vals[0] == "-" {
						delete(inv.vfs, arg.Key)
						continue
					}
					pf, idx, _ := strings.Cut(arg.Vals[0], "/")
					var i int
					fmt.Sscan(idx, &i)
					inv.vfs[arg.Key] = VF{PF: pf, Index: i, PCI: fmt.Sprintf("0000:03:10.%d", i)}
				}
				return "ok\n"
			case "run":
				inv.Running = nil
				if arg, ok := d.Arg("vms"); ok {
					inv.Running = arg.Vals
				}
				if a == nil {
					var devs []string
					for _, dv := range inv.Devices {
						devs = append(devs, dv)
					}
					var err error
					a, err = New(Config{Policy: p, Host: "h1", Kernel: NewFakeKernel(devs...), Inventory: inv, VF: k, VFOriginalsPath: orig})
					if err != nil {
						return "error: " + err.Error() + "\n"
					}
				} else if err := a.Resync(); err != nil {
					return "error: " + err.Error() + "\n"
				}
				return step(t, a, k, inv, p, before)
			case "uninstall":
				done, err := UninstallVFs(k, orig)
				var b strings.Builder
				for _, l := range done {
					b.WriteString(l + "\n")
				}
				if err != nil {
					fmt.Fprintf(&b, "error: %v\n", err)
				}
				if _, err := os.Stat(orig); err == nil {
					b.WriteString("originals file left\n")
				}
				for key, r := range before {
					pf, idx, _ := strings.Cut(key, "/")
					var i int
					fmt.Sscan(idx, &i)
					if got := k.PFs[pf][i]; got != r {
						fmt.Fprintf(&b, "VIOLATION: %s has %s after uninstall, had %s before sluice\n", key, got, r)
					}
				}
				b.WriteString(k.String())
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

// step runs one agent step and renders its changes, the VF status and
// the fake kernel, with the invariants checked from the outside.
func step(t *testing.T, a *Agent, k *FakeVF, inv *vfInventory, p *policy.Policy, before map[string]VFRate) string {
	var b strings.Builder
	w0 := k.Writes
	_, err := a.Step(1e9)
	fmt.Fprintf(&b, "vf writes: %d\n", k.Writes-w0)
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	for _, s := range a.Stats().VFs {
		fmt.Fprintf(&b, "status %s uplink=%s pf=%s vf=%d want=%d/%d have=%d/%d", s.Port, s.Uplink, s.PF, s.Index,
			s.Want.MinTxMbps, s.Want.MaxTxMbps, s.Have.MinTxMbps, s.Have.MaxTxMbps)
		if s.Error != "" {
			fmt.Fprintf(&b, " error=%q", s.Error)
		}
		b.WriteString("\n")
	}
	b.WriteString(k.String())
	// From the outside: the rates each VF should have now.
	want := map[string]VFRate{}
	for _, vm := range inv.Running {
		v := p.VM(vm)
		if v == nil {
			continue
		}
		for _, n := range v.NICs {
			f, ok := inv.vfs[policy.PortName(vm, n.Name)]
			if !n.VF || !ok {
				continue
			}
			lo, hi := n.VFTxRates()
			want[vfKey(f.PF, f.Index)] = VFRate{lo, hi}
		}
	}
	var keys []string
	for key := range before {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		pf, idx, _ := strings.Cut(key, "/")
		var i int
		fmt.Sscan(idx, &i)
		got := k.PFs[pf][i]
		exp, ok := want[key]
		if !ok {
			exp = before[key]
		}
		if got != exp {
			fmt.Fprintf(&b, "VIOLATION: %s has %s, want %s\n", key, got, exp)
		}
	}
	return b.String()
}
