package agent

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/policy"
)

// TestAgent drives the agent against the fake kernel. Commands:
//
//	policy            input: a policy file
//	agent host=H dynamic=true|false
//	step t=MS [PORT=Mbps ...]   traffic sent by each named class since the
//	                            last step (wire Mbit/s), then one control step
//	kernel            the fake kernel's state
//	restart           a new agent on the same kernel (as after a crash)
//
// After each step the harness checks invariants and prints violations:
// a second reconcile of the same state changes nothing; the leaf rates of a
// dynamic tree add up to at most the line rate; every vNIC with unbounded
// demand is entitled to at least its reservation.
func TestAgent(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if filepath.Base(filepath.Dir(path)) == "vf" {
			t.Skip("testdata/vf is TestVFDataDriven's")
		}
		var p *policy.Policy
		var k *FakeKernel
		var a *Agent
		var host string
		var dynamic bool
		var lastMs int64
		record := t.TempDir() + "/state.json"
		newAgent := func() error {
			var err error
			a, err = New(Config{Policy: p, Host: host, Kernel: k, Inventory: testInventory(p, host), Dynamic: dynamic, RecordPath: record})
			return err
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "policy":
				var err error
				p, err = policy.Parse("test.yaml", []byte(d.Input))
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return "ok\n"
			case "agent":
				d.ScanArgs(t, "host", &host)
				dynamic = true
				if d.HasArg("dynamic") {
					d.ScanArgs(t, "dynamic", &dynamic)
				}
				k = NewFakeKernel()
				_ = os.Remove(record)
				if err := newAgent(); err != nil {
					return "error: " + err.Error() + "\n"
				}
				for _, tr := range a.Trees() {
					k.Devs[tr.Dev] = &FakeDev{}
					for _, v := range tr.VNICs {
						k.Devs[v.Dev] = &FakeDev{}
					}
				}
				lastMs = 0
				return "ok\n"
			case "restart":
				if err := newAgent(); err != nil {
					return "error: " + err.Error() + "\n"
				}
				return "ok\n"
			case "kernel":
				return k.String()
			case "step":
				var ms int64
				d.ScanArgs(t, "t", &ms)
				dt := float64(ms-lastMs) / 1000
				for _, arg := range d.CmdArgs {
					if arg.Key == "t" {
						continue
					}
					mbps, err := strconv.ParseFloat(arg.Vals[0], 64)
					if err != nil {
						t.Fatalf("bad rate %s", arg)
					}
					id, dev := findPort(a, arg.Key)
					if dev == "" {
						return "error: no port " + arg.Key + "\n"
					}
					if err := k.AddTraffic(dev, id, uint64(mbps*1e6/8*dt)); err != nil {
						return "error: " + err.Error() + "\n"
					}
				}
				lastMs = ms
				ch, err := a.Step(ms * 1e6)
				var b strings.Builder
				fmt.Fprintf(&b, "changes: %s\n", ch)
				if err != nil {
					fmt.Fprintf(&b, "error: %v\n", err)
				}
				b.WriteString(renderStats(a.Stats()))
				b.WriteString(checkInvariants(a, k))
				return b.String()
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}

func findPort(a *Agent, name string) (Handle, string) {
	for _, tr := range a.Trees() {
		for _, n := range tr.Nodes {
			if n.Name == name {
				return n.ID, tr.Dev
			}
		}
	}
	return 0, ""
}

// renderStats prints the ports that carry traffic or have a guarantee above
// the floor, in Mbit/s.
func renderStats(s Stats) string {
	var b strings.Builder
	for _, u := range s.Uplinks {
		for _, pt := range u.Ports {
			if pt.RateBps == 0 && pt.GuaranteeBps <= u.SpeedBps/1000 && pt.EntitlementBps < 1e6 {
				continue
			}
			fmt.Fprintf(&b, "  %-14s rate %7.1f  entitled %7.1f  htb %7.1f/%7.1f\n", pt.Port,
				pt.RateBps/1e6, pt.EntitlementBps/1e6, float64(pt.GuaranteeBps)/1e6, float64(pt.CeilBps)/1e6)
		}
	}
	return b.String()
}

func checkInvariants(a *Agent, k *FakeKernel) string {
	var out []string
	for _, tr := range a.Trees() {
		var want []HTBClass
		cs, _ := k.Classes(tr.Dev)
		for _, c := range cs {
			want = append(want, c.HTBClass)
		}
		sort.SliceStable(want, func(i, j int) bool { return want[i].Parent < want[j].Parent })
		before := k.Writes
		ch, err := Reconcile(k, tr.Dev, tr.Default, want, tr.Filters, nil)
		if err != nil || ch.Total() != 0 || k.Writes != before {
			out = append(out, fmt.Sprintf("reconciling the same state again wrote %s (err %v)", ch, err))
		}
		for _, v := range tr.VNICs {
			if c, ok, err := k.VNICClass(v.Dev); err != nil || !ok || c != v.Class {
				out = append(out, fmt.Sprintf("vNIC device %s classifies into %s (ok %v, err %v), want %s", v.Dev, c, ok, err, v.Class))
			}
		}
		if a.cfg.Dynamic {
			var sum WireBps
			for _, c := range cs {
				n := nodeByID(tr, c.ID)
				if n != nil && n.Leaf {
					sum += c.RateBps
				}
			}
			if float64(sum) > float64(tr.SpeedBps)*1.001 {
				out = append(out, fmt.Sprintf("%s: leaf rates add up to %.1f Mbit/s > line %.1f", tr.Dev, float64(sum)/1e6, float64(tr.SpeedBps)/1e6))
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "VIOLATION: " + strings.Join(out, "\nVIOLATION: ") + "\n"
}

func nodeByID(t *Tree, id Handle) *Node {
	for _, n := range t.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// testInventory lays out host as the lab does: uplink k is sl-upK, the host
// is 198.18.1.(i+1), NIC j of VM i has host device sl-viNj, vNIC k of the
// policy (file order) 198.18.16.(k+1).
func testInventory(p *policy.Policy, host string) *StaticInventory {
	inv := &StaticInventory{Devices: map[string]string{}, VNICs: map[string]VNICMatch{}}
	for i, h := range p.Hosts {
		if h.Name != host {
			continue
		}
		inv.Addr = netip.AddrFrom4([4]byte{198, 18, 1, byte(i + 1)})
		for k, u := range h.Uplinks {
			inv.Devices[u.Name] = fmt.Sprintf("sl-up%d", k)
		}
	}
	k := 0
	for vi, vm := range p.VMs {
		if vm.Host == host {
			inv.Running = append(inv.Running, vm.Name)
		}
		for ni, n := range vm.NICs {
			if vm.Host == host {
				inv.VNICs[policy.PortName(vm.Name, n.Name)] = VNICMatch{Index: k, HostDev: fmt.Sprintf("sl-v%dn%d", vi, ni),
					SrcIP: netip.AddrFrom4([4]byte{198, 18, 16, byte(k + 1)})}
			}
			k++
		}
	}
	return inv
}
