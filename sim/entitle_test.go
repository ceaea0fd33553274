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
// use it): at the end of each run of the seed scenarios with uplinks, the
// entitlement the simulator records for every port equals entitle's for
// the same cluster (the admitted policy, the VMs' current hosts, demand
// unbounded for ports that carry traffic, 0 for the others), within 0.1%.
// The scenario is seed 000 Fig. 2 shortened, with NFS traffic, a
// migration (so that two uplinks have ports) and a reservation change.
// The simulator keeps its own tree because it follows live state that a
// policy does not hold (failed uplinks, migrations in flight); this test is
// what keeps the two the same where both apply.
func TestEntitlementsMatchPackageEntitle(t *testing.T) {
	for _, c := range []struct {
		name string
		yaml string
	}{
		{"fig2-like", entitleFig2},
	} {
		file := c.name
		sc, err := ParseScenario(c.name, []byte(c.yaml))
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
			now := s.placementNow()
			for i := range p.VMs {
				p.VMs[i].Host = now[p.VMs[i].Name]
				for _, nic := range p.VMs[i].NICs {
					if up := s.portUp[policy.PortName(p.VMs[i].Name, nic.Name)]; up != nil {
						p.VMs[i].Host = up.Host // a VM in flight still sends from its source
					}
				}
			}
			checked, hosts := 0, map[string]bool{}
			for _, up := range s.upOrder {
				if up.hc == nil || up.failed {
					continue
				}
				ent := s.entitlements(up)
				demand := map[string]float64{}
				for name := range ent {
					if s.ports[name].class != s.classIndex("vm") {
						continue // system classes: below
					}
					demand[name] = 0
					if s.active[name] > 0 || len(s.ports[name].queue) > s.ports[name].qhead {
						demand[name] = alloc.Inf
					}
				}
				for _, c := range p.TrafficClasses {
					if c.Name == "vm" {
						continue
					}
					name := policy.ClassName(up.Host, c.Name)
					d := 0.0
					if _, ok := ent[name]; ok && (s.active[name] > 0 || len(s.ports[name].queue) > s.ports[name].qhead) {
						d = alloc.Inf
					}
					demand[up.Host+"/"+up.Name+"/"+c.Name] = d
				}
				n, err := entitle.Network(&p, demand)
				if err != nil {
					t.Fatalf("%s run %s: %v", file, r.Name, err)
				}
				for name, want := range ent {
					var got float64
					for _, pt := range n.Port(name) {
						if pt.Host == up.Host && pt.Uplink == up.Name {
							got = pt.AllocBps()
						}
					}
					if math.Abs(got-want) > 1e-3*math.Max(want, 1e6) {
						t.Errorf("%s run %s: %s on %s/%s: simulator %.4g bps, entitle %.4g bps", file, r.Name, name, up.Host, up.Name, want, got)
					}
					checked++
					hosts[up.Host] = true
				}
			}
			if checked == 0 || !hosts["h2"] {
				t.Errorf("%s run %s: %d ports compared, on hosts %v (want ports on h2 after the migration)", file, r.Name, checked, hosts)
			}
		}
	}
}

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
