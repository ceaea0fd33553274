package placement

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"sluice/entitle"
	"sluice/policy"
)

// TestPackingAgreesWithDerivation checks, on 3,000 random clusters (fixed
// seeds), that placement and the derivation of the uplink trees
// (entitle.Derive, what `sluice alloc`, the agent and the simulator
// enforce) agree on every host's network, before and after a placement
// pass: placement finds no network fault on a host exactly when the
// derived trees honour every vNIC reservation there — each reserving
// vNIC on an uplink that is up (its pinned one, if pinned) and the vNIC
// reservations on each uplink within its vm budget. The clusters have one
// to three uplinks per host (some lost), vm class and other class
// reservations, vNICs pinned to uplinks that exist or not, and
// reservations drawn from few sizes so that ties and packings that only
// largest-first fails occur. Policy validation, with the VMs placed as
// they start, refuses a VM on exactly the hosts placement finds broken.
func TestPackingAgreesWithDerivation(t *testing.T) {
	var agreeOK, agreeBroken int
	for seed := uint64(1); seed <= 3000; seed++ {
		p, cur, down := agreeCluster(seed)
		check := func(stage string, pl Placement) {
			broken := map[string]bool{}
			for _, f := range Check(p, pl, Options{DownUplinks: down}) {
				for _, d := range f.Details {
					if strings.HasPrefix(d, "network:") {
						broken[f.Host] = true
					}
				}
			}
			honoured := derivedHonours(p, pl, down)
			for _, h := range p.Hosts {
				if broken[h.Name] == honoured[h.Name] {
					t.Fatalf("seed %d %s: host %s: placement finds a network fault: %v; the derived trees honour every reservation: %v\n%s",
						seed, stage, h.Name, broken[h.Name], honoured[h.Name], describe(p, pl, h.Name, down))
				}
				if broken[h.Name] {
					agreeBroken++
				} else {
					agreeOK++
				}
			}
		}
		check("before the pass", cur)
		validationAgrees(t, seed, p, cur)
		r := Plan(p, cur, Demand{}, Options{Threshold: 1 + int(seed%5), DownUplinks: down})
		check("after the pass", r.Placement)
		// What the pass decided, it decided by the derivation's packing:
		// a host it does not give up on is honoured by the trees.
		noRepair := map[string]bool{}
		for _, d := range r.Decisions {
			if d.Kind == NoRepair {
				noRepair[d.Host] = true
			}
		}
		honoured := derivedHonours(p, r.Placement, down)
		for _, h := range p.Hosts {
			if !noRepair[h.Name] && !honoured[h.Name] {
				t.Fatalf("seed %d: the pass leaves host %s as sound, but the derived trees do not honour its reservations\n%s\n%s",
					seed, h.Name, r, describe(p, r.Placement, h.Name, down))
			}
		}
	}
	t.Logf("hosts judged alike: %d sound, %d with a network fault", agreeOK, agreeBroken)
	if agreeOK == 0 || agreeBroken == 0 {
		t.Error("the draws never produced a sound host or a broken one")
	}
}

// validationAgrees checks that policy validation (Admission) finds a
// host's VMs not to fit exactly when placement's Check finds the host
// broken, with the VMs placed as cur and every uplink up.
func validationAgrees(t *testing.T, seed uint64, p *policy.Policy, cur Placement) {
	t.Helper()
	q := *p
	q.VMs = append([]policy.VM(nil), p.VMs...)
	for i := range q.VMs {
		q.VMs[i].Host = cur[q.VMs[i].Name]
	}
	refused := map[string]bool{}
	for _, e := range q.Admission() {
		if _, rest, ok := strings.Cut(e.Msg, "does not fit on host "); ok {
			host, _, _ := strings.Cut(rest, ":")
			refused[host] = true
		}
	}
	broken := map[string]bool{}
	for _, f := range Check(&q, cur, Options{}) {
		broken[f.Host] = true
	}
	for _, h := range q.Hosts {
		if refused[h.Name] != broken[h.Name] {
			t.Fatalf("seed %d: host %s: validation refuses a VM there: %v; placement finds it broken: %v\n%v\n%s",
				seed, h.Name, refused[h.Name], broken[h.Name], q.Admission(), describe(&q, cur, h.Name, nil))
		}
	}
}

// derivedHonours reports, per host, whether the derived trees honour
// every vNIC reservation of the VMs placed there.
func derivedHonours(p *policy.Policy, pl Placement, down []string) map[string]bool {
	live := entitle.Live{Hosts: pl, DownUplinks: map[string]bool{}}
	for _, u := range down {
		live.DownUplinks[u] = true
	}
	d := entitle.Derive(p, live)
	ok := map[string]bool{}
	seen := map[string]bool{}
	for _, h := range p.Hosts {
		ok[h.Name] = true
	}
	for _, us := range d.Uplinks {
		u := p.Host(us.Host).Uplink(us.Uplink)
		var sum policy.Bps
		for _, c := range us.Classes {
			for _, v := range c.VNICs {
				pv := p.VM(v.VM)
				var nic *policy.NIC
				for k := range pv.NICs {
					if pv.NICs[k].Name == v.NIC {
						nic = &pv.NICs[k]
					}
				}
				if nic.Reservation == 0 {
					continue
				}
				seen[v.Port] = true
				sum += nic.Reservation
				if us.Down || nic.Uplink != "" && nic.Uplink != us.Uplink {
					ok[us.Host] = false
				}
			}
		}
		if sum > p.VMClassBudget(u) {
			ok[us.Host] = false
		}
	}
	// A reserving vNIC on no tree (its host has no uplink up) is not
	// honoured either.
	for _, v := range p.VMs {
		for _, n := range v.NICs {
			if h := pl[v.Name]; h != "" && n.Reservation > 0 && !seen[policy.PortName(v.Name, n.Name)] {
				ok[h] = false
			}
		}
	}
	return ok
}

func describe(p *policy.Policy, pl Placement, host string, down []string) string {
	var b strings.Builder
	h := p.Host(host)
	for _, u := range h.Uplinks {
		fmt.Fprintf(&b, "  uplink %s budget %s\n", u.Name, policy.FormatRate(p.VMClassBudget(&u)))
	}
	fmt.Fprintf(&b, "  down %v\n", down)
	var vms []string
	for v, hn := range pl {
		if hn == host {
			vms = append(vms, v)
		}
	}
	sort.Strings(vms)
	for _, v := range vms {
		for _, n := range p.VM(v).NICs {
			fmt.Fprintf(&b, "  %s/%s %s pin %q\n", v, n.Name, policy.FormatRate(n.Reservation), n.Uplink)
		}
	}
	return b.String()
}

func agreeCluster(seed uint64) (*policy.Policy, Placement, []string) {
	rng := rand.New(rand.NewPCG(seed, 29))
	p := &policy.Policy{Cluster: "agree", ReservationCap: 0.75}
	for _, n := range policy.TrafficClassNames {
		tc := policy.TrafficClass{Name: n, Shares: 50, Limit: policy.Unlimited}
		switch {
		case n == "vm" && rng.IntN(3) == 0:
			tc.Reservation = policy.Bps(4+rng.IntN(3)) * 1e9
		case n == "vmotion" && rng.IntN(3) == 0:
			tc.Reservation = 1e9
		}
		p.TrafficClasses = append(p.TrafficClasses, tc)
	}
	var down []string
	nh := 2 + rng.IntN(3)
	for h := 0; h < nh; h++ {
		host := policy.Host{Name: fmt.Sprintf("h%d", h), CPU: policy.HostCPU{Cores: 64, MHz: 2000}, Memory: 1 << 40}
		for u := 0; u < 1+rng.IntN(3); u++ {
			host.Uplinks = append(host.Uplinks, policy.Uplink{Name: fmt.Sprintf("u%d", u), Speed: 10e9, Usable: 9.4e9})
			if rng.IntN(8) == 0 {
				down = append(down, host.Name+"/"+host.Uplinks[u].Name)
			}
		}
		p.Hosts = append(p.Hosts, host)
	}
	cur := Placement{}
	nv := 2 + rng.IntN(5*nh)
	for i := 0; i < nv; i++ {
		v := policy.VM{Name: fmt.Sprintf("v%d", i), Migratable: rng.IntN(5) != 0, CPU: policy.VMCPU{VCPUs: 1}, Memory: 1 << 30}
		for k := 0; k < rng.IntN(4); k++ {
			n := policy.NIC{Name: fmt.Sprintf("nic%d", k), Shares: 50, Limit: policy.Unlimited,
				Reservation: []policy.Bps{0, 1e9, 2e9, 2e9, 3e9, 5e9, 6e9}[rng.IntN(7)]}
			if rng.IntN(6) == 0 {
				n.Uplink = fmt.Sprintf("u%d", rng.IntN(3))
			}
			v.NICs = append(v.NICs, n)
		}
		p.VMs = append(p.VMs, v)
		if rng.IntN(4) != 0 {
			cur[v.Name] = p.Hosts[rng.IntN(nh)].Name
		}
	}
	return p, cur, down
}
