package sim

import (
	"math"
	"testing"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/policy"
)

// TestEntitlementsMatchPackageEntitle checks that the simulator divides an
// uplink the way package entitle does (the CLI, the agent and placement
// use it): at the end of each run, the entitlement the simulator records
// for every port equals entitle.Network's for the same cluster (the
// admitted policy, each VM on the host its traffic leaves from, demand
// unbounded for ports that carry traffic, 0 for the others), within 0.1%.
// The scenario is seed 000 Fig. 2 shortened, with NFS traffic, a
// migration (so that two uplinks have ports) and a reservation change.
func TestEntitlementsMatchPackageEntitle(t *testing.T) {
	sc, err := ParseScenario("fig2-like", []byte(entitleFig2))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Runs {
		s := r.sim
		p := *s.cur
		p.VMs = append([]policy.VM(nil), s.cur.VMs...)
		for i := range p.VMs {
			p.VMs[i].Host = s.vmHost[p.VMs[i].Name] // a VM in flight still sends from its source
		}
		checked, hosts := 0, map[string]bool{}
		for _, up := range s.upOrder {
			if up.hc == nil || up.failed {
				continue
			}
			busy := func(name string) float64 {
				if pt := s.ports[name]; pt != nil && pt.up == up && (s.active[name] > 0 || len(pt.queue) > pt.qhead) {
					return alloc.Inf
				}
				return 0
			}
			demand := map[string]float64{}
			for _, u := range s.des.HostUplinks(up.Host) {
				for _, c := range u.Classes {
					if u.Uplink == up.Name && c.Class != "vm" {
						demand[up.Host+"/"+up.Name+"/"+c.Class] = busy(c.Name)
					}
					for _, v := range c.VNICs {
						demand[v.Port] = busy(v.Port)
					}
				}
			}
			n, err := entitle.Network(&p, demand)
			if err != nil {
				t.Fatalf("run %s: %v", r.Name, err)
			}
			for name, want := range s.entitlements(up) {
				var got float64
				for _, pt := range n.Port(name) {
					if pt.Host == up.Host && pt.Uplink == up.Name {
						got = pt.AllocBps()
					}
				}
				if math.Abs(got-want) > 1e-3*math.Max(want, 1e6) {
					t.Errorf("run %s: %s on %s/%s: simulator %.4g bps, entitle %.4g bps", r.Name, name, up.Host, up.Name, want, got)
				}
				checked++
				if want > 0 {
					hosts[up.Host] = true
				}
			}
		}
		if checked == 0 || !hosts["h2"] {
			t.Errorf("run %s: %d ports compared, busy on hosts %v (want ports on h2 after the migration)", r.Name, checked, hosts)
		}
	}
}

// TestEntitlements checks the simulator's exported entitlements against
// package entitle on a cluster with two uplinks per host: pinned and
// best-fit vNICs, a passthrough vNIC (on no uplink), a VM without a host
// (nowhere), a declared class, finite demands and an idle vNIC.
func TestEntitlements(t *testing.T) {
	p, err := policy.Parse("two-uplinks", []byte(twoUplinks))
	if err != nil {
		t.Fatal(err)
	}
	for _, demand := range []map[string]float64{
		nil,
		{"vm1/nic0": 2e9, "vm3/nic0": 0, "h1/nfs": 1e9, "h1/vmotion": alloc.Inf, "vm5/nic0": 1e9},
	} {
		got, err := Entitlements(p, demand)
		if err != nil {
			t.Fatal(err)
		}
		want, err := entitle.Network(p, demand)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range got {
			seen[e.Port] = true
			pts := want.Port(e.Port)
			if len(pts) != 1 || pts[0].Host != e.Host || pts[0].Uplink != e.Uplink {
				t.Errorf("demand %v: %s on %s/%s in the simulator, entitle has %v", demand, e.Port, e.Host, e.Uplink, pts)
				continue
			}
			if w := pts[0].AllocBps(); math.Abs(w-e.AllocBps) > 1e-6*math.Max(w, 1) {
				t.Errorf("demand %v: %s: simulator %.6g bps, entitle %.6g bps", demand, e.Port, e.AllocBps, w)
			}
		}
		for _, pt := range want.Ports {
			if pt.Kind == entitle.KindVNIC && !seen[pt.Name] {
				t.Errorf("demand %v: %s is on %s/%s in entitle, not in the simulator", demand, pt.Name, pt.Host, pt.Uplink)
			}
		}
		if seen["vm4/nic0"] || seen["vm5/nic0"] || len(seen) != 4 {
			t.Errorf("demand %v: simulator scheduled %v (want vm1, vm2, vm3, vm6 only)", demand, seen)
		}
	}
	if _, err := Entitlements(p, map[string]float64{"vm9/nic0": 1}); err == nil {
		t.Error("a demand for no port was accepted")
	}
}

const twoUplinks = `
cluster: t
trafficClasses: {vm: {shares: 100}, nfs: {shares: 50, reservation: 500Mbps}}
hosts:
  - {name: h1, cpu: {cores: 8, mhz: 2800}, memory: 64GiB, uplinks: [{name: u0, speed: 10Gbps, usable: 9.4Gbps}, {name: u1, speed: 10Gbps}]}
  - {name: h2, cpu: {cores: 8, mhz: 2800}, memory: 64GiB, uplinks: [{name: u0, speed: 10Gbps}]}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 5Gbps}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 2Gbps, limit: 3Gbps}]}
  - {name: vm3, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, shares: high, uplink: u0}]}
  - {name: vm4, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, passthrough: true}]}
  - {name: vm5, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0}]}
  - {name: vm6, host: h2, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 100Mbps}]}
`

const entitleFig2 = `
name: entitle-fig2
seed: 1
duration: 2500ms
sample: 500ms
policy:
  cluster: t
  trafficClasses: {vm: {shares: 100}, nfs: {shares: 50}, vmotion: {shares: 50}}
  hosts:
    - {name: h1, cpu: {cores: 8, mhz: 2800}, memory: 64GiB, uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]}
    - {name: h2, cpu: {cores: 8, mhz: 2800}, memory: 64GiB, uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]}
  vms:
    - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, shares: normal}]}
    - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 64MiB, nics: [{name: nic0, shares: high}]}
    - {name: vm3, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, shares: normal, reservation: 1Gbps}]}
workloads:
  - {name: vm1, type: bulk, port: vm1/nic0, streams: 4}
  - {name: vm2, type: bulk, port: vm2/nic0, streams: 4}
  - {name: vm3, type: bulk, port: vm3/nic0, streams: 4}
  - {name: nfs, type: bulk, port: h1/nfs, streams: 4}
timeline:
  - {at: 200ms, set: vm1/nic0, reservation: 5Gbps}
  - {at: 300ms, migrate: vm2, to: h2}
`
