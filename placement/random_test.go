package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"sluice/policy"
)

// TestRandomClusters runs one pass on 300 small random clusters (fixed
// seeds) with random reservations, pinned and non-migratable VMs, lost
// uplinks and power-on requests, and checks from the outside: every host
// the pass does not declare unrepairable meets its reservations afterwards;
// non-migratable VMs stay; running VMs keep running; every power-on request
// is admitted or refused; a second pass at threshold 1 finds nothing to do.
func TestRandomClusters(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		p, cur := randomCluster(seed)
		th := 1 + int(seed%5)
		r := Plan(p, cur, Demand{}, Options{Threshold: th})
		name := fmt.Sprintf("seed %d threshold %d", seed, th)
		noRepair := map[string]bool{}
		decided := map[string]bool{}
		for _, d := range r.Decisions {
			switch d.Kind {
			case NoRepair:
				noRepair[d.Host] = true
			case Admit, Refuse:
				decided[d.VM] = true
			}
			if d.IsMove() && !p.VM(d.VM).Migratable {
				t.Errorf("%s: %s is not migratable but moved", name, d.VM)
			}
		}
		for _, f := range Check(p, r.Placement, Options{}) {
			if f.Host != "" && !noRepair[f.Host] {
				t.Errorf("%s: host %s broken after the pass: %v", name, f.Host, f.Details)
			}
		}
		for _, v := range p.VMs {
			if h := cur[v.Name]; h != "" && r.Placement[v.Name] == "" {
				t.Errorf("%s: %s was running on %s and is not placed", name, v.Name, h)
			}
			if cur[v.Name] == "" && !decided[v.Name] {
				t.Errorf("%s: power-on of %s not decided", name, v.Name)
			}
		}
		if len(noRepair) == 0 {
			again := Plan(p, r.Placement, Demand{}, Options{Threshold: 1})
			for _, d := range again.Decisions {
				if d.Kind != Refuse && d.Kind != Fault {
					t.Errorf("%s: second pass still acts: %s", name, d)
				}
			}
		}
	}
}

func randomCluster(seed uint64) (*policy.Policy, Placement) {
	rng := rand.New(rand.NewPCG(seed, 7))
	p := &policy.Policy{Cluster: "rnd", ReservationCap: 0.75}
	for _, n := range policy.TrafficClassNames {
		p.TrafficClasses = append(p.TrafficClasses, policy.TrafficClass{Name: n, Shares: 50, Limit: policy.Unlimited})
	}
	nh := 2 + rng.IntN(5)
	for h := 0; h < nh; h++ {
		host := policy.Host{Name: fmt.Sprintf("h%d", h), CPU: policy.HostCPU{Cores: 4 + 4*rng.IntN(4), MHz: 2000},
			Memory: policy.Bytes(16+16*rng.IntN(4)) << 30}
		for u := 0; u < 1+rng.IntN(2); u++ {
			host.Uplinks = append(host.Uplinks, policy.Uplink{Name: fmt.Sprintf("vmnic%d", u), Speed: 10e9, Usable: 9.4e9})
		}
		p.Hosts = append(p.Hosts, host)
	}
	cur := Placement{}
	nv := 3 + rng.IntN(4*nh)
	for i := 0; i < nv; i++ {
		v := policy.VM{Name: fmt.Sprintf("v%d", i), Migratable: rng.IntN(6) != 0,
			CPU:    policy.VMCPU{VCPUs: 1 + rng.IntN(4), ReservationMHz: 500 * rng.IntN(6)},
			Memory: policy.Bytes(1+rng.IntN(8)) << 30}
		for k := 0; k < rng.IntN(3); k++ {
			n := policy.NIC{Name: fmt.Sprintf("nic%d", k), Shares: 50, Limit: policy.Unlimited,
				Reservation: policy.Bps(rng.IntN(8)) * 500e6}
			if rng.IntN(8) == 0 {
				n.Uplink = "vmnic0"
			}
			v.NICs = append(v.NICs, n)
		}
		p.VMs = append(p.VMs, v)
		if rng.IntN(5) != 0 {
			cur[v.Name] = p.Hosts[rng.IntN(nh)].Name
		}
	}
	// Sometimes an uplink is lost.
	if rng.IntN(3) == 0 {
		h := &p.Hosts[rng.IntN(nh)]
		h.Uplinks = h.Uplinks[:len(h.Uplinks)-1]
	}
	return p, cur
}
