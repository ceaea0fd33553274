package entitle

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"sluice/policy"
)

// randomLive is a random cluster (one to four uplinks per host, a vm
// class reservation or none, pinned, passthrough and unreserved vNICs)
// with a random live state: VMs off, on hosts the policy lacks or on the
// policy's hosts (Hosts nil), lost uplinks, and running VMs the policy
// does not name.
func randomLive(seed uint64) (*policy.Policy, Live) {
	rng := rand.New(rand.NewPCG(seed, 53))
	p := &policy.Policy{Cluster: "rnd", ReservationCap: 0.75}
	for _, n := range policy.TrafficClassNames {
		tc := policy.TrafficClass{Name: n, Shares: 50 * (1 + rng.IntN(2)), Limit: policy.Unlimited, Declared: rng.IntN(2) == 0}
		if n == "vm" && rng.IntN(3) == 0 {
			tc.Reservation = policy.Bps(1+rng.IntN(5)) * 1e9
		}
		if n == "vmotion" && rng.IntN(3) == 0 {
			tc.Limit = 2e9
		}
		p.TrafficClasses = append(p.TrafficClasses, tc)
	}
	p.UnnamedVMs.Shares = 25
	p.UnnamedVMs.Limit = policy.Unlimited
	live := Live{Hosts: map[string]string{}, DownUplinks: map[string]bool{}}
	nh := 1 + rng.IntN(5)
	for h := 0; h < nh; h++ {
		host := policy.Host{Name: fmt.Sprintf("h%d", h)}
		for u := 0; u < 1+rng.IntN(4); u++ {
			host.Uplinks = append(host.Uplinks, policy.Uplink{Name: fmt.Sprintf("u%d", u), Speed: 10e9, Usable: policy.Bps(rng.IntN(2)) * 9.4e9})
			if rng.IntN(8) == 0 {
				live.DownUplinks[host.Name+"/"+host.Uplinks[u].Name] = true
			}
		}
		p.Hosts = append(p.Hosts, host)
	}
	for i := 0; i < rng.IntN(6*nh); i++ {
		v := policy.VM{Name: fmt.Sprintf("v%d", i)}
		for k := 0; k < rng.IntN(4); k++ {
			n := policy.NIC{Name: fmt.Sprintf("nic%d", k), Shares: 25 * (1 + rng.IntN(4)), Limit: policy.Unlimited,
				Reservation: []policy.Bps{0, 0, 5e8, 1e9, 2e9, 3e9, 6e9}[rng.IntN(7)]}
			switch rng.IntN(8) {
			case 0:
				n.Uplink = fmt.Sprintf("u%d", rng.IntN(4))
			case 1:
				n.Limit = n.Reservation + 1e9
			case 2:
				n.Passthrough, n.Reservation = true, 0
			}
			v.NICs = append(v.NICs, n)
		}
		h := p.Hosts[rng.IntN(nh)].Name
		switch rng.IntN(8) {
		case 0: // off
		case 1:
			live.Hosts[v.Name] = "gone"
		default:
			live.Hosts[v.Name] = h
		}
		if rng.IntN(4) != 0 {
			v.Host = h
		}
		p.VMs = append(p.VMs, v)
	}
	for i := 0; i < rng.IntN(3); i++ {
		live.Unnamed = append(live.Unnamed, UnnamedVM{Name: fmt.Sprintf("dom%d", i), Host: fmt.Sprintf("h%d", rng.IntN(nh+1)), NICs: []string{"vnet0", "vnet1"}[:1+rng.IntN(2)]})
	}
	if rng.IntN(6) == 0 {
		live.Hosts = nil // every VM where the policy puts it
	}
	return p, live
}

// TestDeriveHostsAgrees checks, on 3,000 random clusters, that
// DeriveHosts gives exactly the trees Derive gives for the hosts it is
// given, in the same order, and that every port on them gets the same
// entitlement.
func TestDeriveHostsAgrees(t *testing.T) {
	var trees, ports int
	for seed := uint64(1); seed <= 3000; seed++ {
		p, live := randomLive(seed)
		rng := rand.New(rand.NewPCG(seed, 59))
		var hosts []string
		for _, h := range p.Hosts {
			if rng.IntN(2) == 0 {
				hosts = append(hosts, h.Name)
			}
		}
		if rng.IntN(5) == 0 {
			hosts = append(hosts, "gone")
		}
		whole := Derive(p, live)
		var want []UplinkSpec
		for _, u := range whole.Uplinks {
			if slices.Contains(hosts, u.Host) {
				want = append(want, u)
			}
		}
		got := DeriveHosts(p, live, hosts)
		if !reflect.DeepEqual(got.Uplinks, want) || got.Datastores != nil {
			t.Fatalf("seed %d hosts %v:\nDeriveHosts %+v\nDerive      %+v", seed, hosts, got.Uplinks, want)
		}
		trees += len(want)
		wn, gn := NewNet(whole), NewNet(got)
		wn.Compute()
		gn.Compute()
		for _, pt := range gn.Ports {
			w := wn.Port(pt.Name)
			g := gn.Port(pt.Name)
			if len(w) < len(g) {
				t.Fatalf("seed %d: port %s: %d in the whole derivation, %d in the scoped one", seed, pt.Name, len(w), len(g))
			}
			for i := range g {
				if w[i].Host != g[i].Host || w[i].Uplink != g[i].Uplink || w[i].AllocBps() != g[i].AllocBps() {
					t.Fatalf("seed %d: port %s: %s/%s %v, whole %s/%s %v", seed, pt.Name, g[i].Host, g[i].Uplink, g[i].AllocBps(), w[i].Host, w[i].Uplink, w[i].AllocBps())
				}
			}
			ports++
		}
	}
	t.Logf("compared %d uplink trees, %d ports", trees, ports)
}
