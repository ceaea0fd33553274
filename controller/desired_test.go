package controller

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"sluice/entitle"
	"sluice/placement"
	"sluice/policy"
)

// desiredPerHost renders a host's desired state from the derivation of
// the whole policy d: every host sorts every VM's name and scans every
// uplink and disk of the cluster (O(hosts × VMs log VMs) per change). It
// is the reference of TestDesiredByHost (desiredOf derives each host from
// its part alone) and the "before" of BenchmarkRenderDesired.
func desiredPerHost(host string, p *policy.Policy, d *entitle.Desired, place map[string]string) DesiredHost {
	out := emptyDesired(host)
	for _, vm := range sortedKeys(place) {
		if place[vm] == host {
			out.VMs = append(out.VMs, vm)
			if v := p.VM(vm); v != nil {
				out.CPU = append(out.CPU, WireCPU{VM: vm, VCPUs: v.CPU.VCPUs, ReservationMHz: v.CPU.ReservationMHz, Shares: v.CPU.Shares,
					LimitMHz: v.CPU.LimitMHz, MemoryBytes: int64(v.Memory)})
			}
		}
	}
	for _, u := range d.HostUplinks(host) {
		wu := WireUplink{Uplink: u.Uplink, SpeedBps: u.SpeedBps, UsableBps: u.UsableBps, Down: u.Down}
		for _, c := range u.Classes {
			wc := WireClass{Name: c.Name, Class: c.Class, ReservationBps: c.ReservationBps, Shares: c.Shares,
				LimitBps: limitPtr(c.LimitBps), Declared: c.Declared}
			for _, v := range c.VNICs {
				wc.VNICs = append(wc.VNICs, WireVNIC{Port: v.Port, ReservationBps: v.ReservationBps, Shares: v.Shares, LimitBps: limitPtr(v.LimitBps)})
			}
			wu.Classes = append(wu.Classes, wc)
		}
		out.Uplinks = append(out.Uplinks, wu)
	}
	for _, ds := range d.Datastores {
		for _, dk := range ds.Disks {
			if dk.Host == host {
				out.Disks = append(out.Disks, WireDisk{Name: dk.Name, Datastore: ds.Name, ReservationIOPS: dk.ReservationIOPS,
					Shares: dk.Shares, LimitIOPS: limitPtr(dk.LimitIOPS)})
			}
		}
	}
	return out
}

func decodeFile(t testing.TB, path string) *policy.Policy {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(path, b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDesiredByHost: every host's desired state, derived from the host's
// part of the policy alone, is byte for byte what the derivation of the
// whole policy gives for that host, for the examples (disks, several
// uplinks, a host with nothing running) and the benchmark's cluster with
// a VM moved.
func TestDesiredByHost(t *testing.T) {
	cases := map[string]*policy.Policy{}
	for _, f := range []string{"netioc-fig2.yaml", "netioc-exp1.yaml", "sioc-2host.yaml", "lab-1g.yaml"} {
		cases[f] = decodeFile(t, "../examples/"+f)
	}
	p, err := policy.Parse("scale.yaml", scalePolicy(20, 300))
	if err != nil {
		t.Fatal(err)
	}
	cases["scale 20×300"] = p
	for name, p := range cases {
		place := placement.Placement{}
		for _, v := range p.VMs {
			if v.Host != "" {
				place[v.Name] = v.Host
			}
		}
		if name == "scale 20×300" {
			place["vm00007"] = "h0019"
			delete(place, "vm00008")
		}
		d := entitle.Derive(p, entitle.Live{Hosts: place})
		byHost := desiredOf(p, place, nil, nil)
		n := 0
		for _, h := range p.Hosts {
			got := *byHost[h.Name]
			got.Policy = nil
			want := desiredPerHost(h.Name, p, d, place)
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if string(gb) != string(wb) {
				t.Errorf("%s: host %s:\n got %s\nwant %s", name, h.Name, gb, wb)
			}
			n += len(want.VMs)
		}
		if n != len(place) {
			t.Errorf("%s: %d VMs rendered, %d running", name, n, len(place))
		}
	}
}

// BenchmarkRenderDesired renders and encodes every host's desired state
// of SLUICE_SCALE_HOSTS × SLUICE_SCALE_VMS (default 1,000 × 30,000), as
// publishOps does on every change: host by host as before (per-host), and
// in one pass (once). Both in one run, so that their ratio holds on a
// busy machine.
func BenchmarkRenderDesired(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	p, err := policy.Parse("scale.yaml", scalePolicy(nh, nv))
	if err != nil {
		b.Fatal(err)
	}
	place := placement.Placement{}
	for _, v := range p.VMs {
		place[v.Name] = v.Host
	}
	b.Run(fmt.Sprintf("per-host-%dx%d", nh, nv), func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			d := entitle.Derive(p, entitle.Live{Hosts: place})
			for _, h := range p.Hosts {
				if _, err := json.Marshal(desiredPerHost(h.Name, p, d, place)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run(fmt.Sprintf("once-%dx%d", nh, nv), func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			byHost := desiredOf(p, place, nil, nil)
			for _, h := range p.Hosts {
				if _, err := json.Marshal(byHost[h.Name]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
