package placement

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/feasible"
	"sluice/policy"
)

// The shortcuts that check part of a cluster (CheckHosts, Change.Hosts,
// the refusals of Change.Apply) against the whole-cluster answers, on
// random clusters with network pools, datastores with IOPS reservations,
// traffic class reservations that may break the cap, pinned and
// passthrough vNICs, lost uplinks, off VMs and VMs placed on hosts the
// policy lacks.

// scopeCluster is a random cluster of one of the package's generators
// (randomCluster, agreeCluster) with network pools and datastores added.
func scopeCluster(seed uint64) (*policy.Policy, Placement, []string) {
	var p *policy.Policy
	var cur Placement
	var down []string
	if seed%2 == 0 {
		p, cur = randomCluster(seed)
	} else {
		p, cur, down = agreeCluster(seed)
	}
	rng := rand.New(rand.NewPCG(seed, 41))
	if rng.IntN(6) == 0 {
		// A class reservation that some uplinks cannot hold.
		for i := range p.TrafficClasses {
			if p.TrafficClasses[i].Name == "nfs" {
				p.TrafficClasses[i].Reservation = 7e9
			}
		}
		p.Hosts[0].Uplinks = append(p.Hosts[0].Uplinks, policy.Uplink{Name: "slow", Speed: 1e9})
	}
	for k := 0; k < rng.IntN(3); k++ {
		np := policy.NetworkPool{Name: fmt.Sprintf("pool%d", k), Reservation: policy.Bps(1+rng.IntN(30)) * 1e9,
			PortGroups: []string{fmt.Sprintf("pg%d", k)}}
		if rng.IntN(2) == 0 {
			for _, h := range p.Hosts {
				if rng.IntN(2) == 0 {
					np.Hosts = append(np.Hosts, h.Name)
				}
			}
		}
		p.NetworkPools = append(p.NetworkPools, np)
	}
	for d := 0; d < rng.IntN(3); d++ {
		ds := policy.Datastore{Name: fmt.Sprintf("ds%d", d)}
		if rng.IntN(3) != 0 {
			ds.Array = policy.Array{Slots: 1 + rng.IntN(4), ServiceTime: time.Millisecond}
		}
		p.Datastores = append(p.Datastores, ds)
	}
	for i := range p.VMs {
		v := &p.VMs[i]
		for k := range v.NICs {
			if rng.IntN(2) == 0 {
				v.NICs[k].PortGroup = fmt.Sprintf("pg%d", rng.IntN(3))
			}
			if v.NICs[k].Reservation == 0 && v.NICs[k].Uplink == "" && rng.IntN(10) == 0 {
				v.NICs[k].Passthrough = true
			}
		}
		for k := 0; k < rng.IntN(3); k++ {
			v.Disks = append(v.Disks, policy.Disk{Name: fmt.Sprintf("d%d", k), Datastore: fmt.Sprintf("ds%d", rng.IntN(3)),
				Shares: 1000, ReservationIOPS: policy.IOPS(100 * rng.IntN(12)), LimitIOPS: policy.UnlimitedIOPS})
		}
	}
	if rng.IntN(8) == 0 {
		cur[p.VMs[0].Name] = "gone" // a host the policy lacks
	}
	if rng.IntN(8) == 0 {
		cur = nil // the hosts the policy gives
		for i := range p.VMs {
			if rng.IntN(3) != 0 {
				p.VMs[i].Host = p.Hosts[rng.IntN(len(p.Hosts))].Name
			}
		}
	}
	return p, cur, down
}

// randomScope names some of p's hosts, and sometimes one it lacks.
func randomScope(rng *rand.Rand, p *policy.Policy) []string {
	hosts := []string{}
	for _, h := range p.Hosts {
		if rng.IntN(3) == 0 {
			hosts = append(hosts, h.Name)
		}
	}
	if rng.IntN(5) == 0 {
		hosts = append(hosts, "nowhere")
	}
	return hosts
}

// TestCheckHostsAgrees checks, on 3,000 random clusters, that CheckHosts
// gives exactly Check's decisions for the hosts it is given, and every
// cluster-wide one.
func TestCheckHostsAgrees(t *testing.T) {
	var faults, cluster int
	for seed := uint64(1); seed <= 3000; seed++ {
		p, cur, down := scopeCluster(seed)
		rng := rand.New(rand.NewPCG(seed, 43))
		o := Options{DownUplinks: down}
		for _, hosts := range [][]string{nil, randomScope(rng, p), randomScope(rng, p)} {
			want := []Decision{}
			for _, d := range Check(p, cur, o) {
				if d.Host == "" || containsName(hosts, d.Host) {
					want = append(want, d)
					if d.Host == "" {
						cluster++
					} else {
						faults++
					}
				}
			}
			got := append([]Decision{}, CheckHosts(p, cur, o, hosts)...)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d hosts %v:\nCheckHosts %v\nCheck      %v", seed, hosts, got, want)
			}
		}
	}
	t.Logf("decisions compared: %d host faults, %d cluster-wide", faults, cluster)
	if faults == 0 || cluster == 0 {
		t.Error("the draws never produced a host fault or a cluster-wide one")
	}
}

func containsName(names []string, n string) bool {
	for _, m := range names {
		if m == n {
			return true
		}
	}
	return false
}

// randomChange is a change of the grammar on p's names (some refused,
// some wrong).
func randomChange(rng *rand.Rand, p *policy.Policy) string {
	v := &p.VMs[rng.IntN(len(p.VMs))]
	h := &p.Hosts[rng.IntN(len(p.Hosts))]
	nic, disk := "nic9", "d9"
	if len(v.NICs) > 0 {
		nic = v.NICs[rng.IntN(len(v.NICs))].Name
	}
	if len(v.Disks) > 0 {
		disk = v.Disks[rng.IntN(len(v.Disks))].Name
	}
	rates := []string{"0", "500Mbps", "1Gbps", "2Gbps", "3Gbps", "5Gbps", "6.5Gbps", "8Gbps", "12Gbps", "40Gbps"}
	switch rng.IntN(14) {
	case 0, 1, 2, 3:
		return fmt.Sprintf("%s/%s.reservation=%s", v.Name, nic, rates[rng.IntN(len(rates))])
	case 4:
		return fmt.Sprintf("%s/%s.limit=%s", v.Name, nic, []string{"unlimited", "1Gbps", "4Gbps"}[rng.IntN(3)])
	case 5:
		return fmt.Sprintf("%s/%s.uplink=%s", v.Name, nic, []string{"", "u0", "u1", "vmnic0", "vmnic1", "u7"}[rng.IntN(6)])
	case 6:
		return fmt.Sprintf("%s/%s.reservation=%d", v.Name, disk, 200*rng.IntN(20))
	case 7:
		return fmt.Sprintf("%s.cpu.reservation=%dMHz", v.Name, 1000*rng.IntN(40))
	case 8:
		return fmt.Sprintf("%s.memory=%dGiB", v.Name, 1+rng.IntN(200))
	case 9:
		return fmt.Sprintf("%s.vcpus=%d", v.Name, 1+rng.IntN(40))
	case 10:
		to := h.Name
		if rng.IntN(8) == 0 {
			to = ""
		}
		return fmt.Sprintf("%s.host=%s", v.Name, to)
	case 11:
		if len(h.Uplinks) > 0 && rng.IntN(4) != 0 {
			return fmt.Sprintf("%s/%s.down", h.Name, h.Uplinks[rng.IntN(len(h.Uplinks))].Name)
		}
		return fmt.Sprintf("%s/%s.down", h.Name, "vmnic7")
	case 12:
		return fmt.Sprintf("%s.%s", h.Name, []string{"memory=8GiB", "cores=2", "mhz=1000", "memory=4TiB"}[rng.IntN(4)])
	}
	return "nobody.memory=1GiB"
}

// TestApplyAgrees checks, on 4,000 random changes to random clusters,
// that Change.Apply accepts, refuses (with the same reason) or rejects
// exactly as it did when it checked whole clusters (applyWhole), and that
// the faults a change brings, found on Change.Hosts with CheckHosts, are
// those the whole-cluster Check finds, with the placement kept and with
// the one Apply returns.
func TestApplyAgrees(t *testing.T) {
	var applied, refused, newFaults int
	for seed := uint64(1); seed <= 4000; seed++ {
		p, cur, _ := scopeCluster(seed)
		rng := rand.New(rand.NewPCG(seed, 47))
		spec := randomChange(rng, p)
		c, err := ParseChange(spec)
		if err != nil {
			t.Fatalf("seed %d: %q: %v", seed, spec, err)
		}
		was := deepCopy(p)
		np, pl, err := c.Apply(p, cur)
		if !reflect.DeepEqual(p, was) {
			t.Fatalf("seed %d: %q modified the policy it was applied to", seed, spec)
		}
		wnp, wpl, werr := applyWhole(c, p, cur)
		if pnp, perr := c.Policy(p, cur); fmt.Sprint(perr) != fmt.Sprint(err) || !reflect.DeepEqual(pnp, np) {
			t.Fatalf("seed %d: %q: Policy %v, Apply %v", seed, spec, perr, err)
		}
		if fmt.Sprint(err) != fmt.Sprint(werr) || !reflect.DeepEqual(np, wnp) || !reflect.DeepEqual(pl, wpl) {
			t.Fatalf("seed %d: %q:\nApply      %v %v\napplyWhole %v %v", seed, spec, err, pl, werr, wpl)
		}
		if _, ok := err.(*RefusedError); ok {
			refused++
		}
		if err != nil {
			continue
		}
		applied++
		hosts := c.Hosts(p, cur)
		for _, after := range []Placement{cur, pl} {
			want := brought(Check(p, cur, Options{}), Check(np, after, Options{}))
			got := brought(CheckHosts(p, cur, Options{}, hosts), CheckHosts(np, after, Options{}, hosts))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d: %q on hosts %v:\nscoped %v\nwhole  %v", seed, spec, hosts, got, want)
			}
			newFaults += len(want)
			// Every other host keeps its decision as it was.
			for _, h := range p.Hosts {
				if !containsName(hosts, h.Name) && !reflect.DeepEqual(ofHost(Check(p, cur, Options{}), h.Name), ofHost(Check(np, after, Options{}), h.Name)) {
					t.Fatalf("seed %d: %q: host %s, not in %v, changed its faults", seed, spec, h.Name, hosts)
				}
			}
		}
	}
	t.Logf("changes: %d applied, %d refused; faults they brought: %d", applied, refused, newFaults)
	if applied == 0 || refused == 0 || newFaults == 0 {
		t.Error("the draws never applied, refused or broke something")
	}
}

// brought is the decisions of after that before does not have (by host
// and reason), as the controller reports a change's faults.
func brought(before, after []Decision) []Decision {
	seen := map[string]bool{}
	for _, d := range before {
		seen[d.Host+"|"+d.Why] = true
	}
	out := []Decision{}
	for _, d := range after {
		if !seen[d.Host+"|"+d.Why] {
			out = append(out, d)
		}
	}
	return out
}

// deepCopy copies p down to its hosts' uplinks and its VMs' NICs and
// disks.
func deepCopy(p *policy.Policy) *policy.Policy {
	np := clonePolicy(p)
	for i := range np.Hosts {
		np.Hosts[i].Uplinks = slices.Clone(p.Hosts[i].Uplinks)
	}
	for i := range np.VMs {
		np.VMs[i].NICs = slices.Clone(p.VMs[i].NICs)
		np.VMs[i].Disks = slices.Clone(p.VMs[i].Disks)
	}
	return np
}

// ofHost is the decisions of ds about host.
func ofHost(ds []Decision, host string) []Decision {
	var out []Decision
	for _, d := range ds {
		if d.Host == host {
			out = append(out, d)
		}
	}
	return out
}

// applyWhole is Change.Apply as it was before it checked only what a
// change touches: the refusals from placement states and Checks of the
// whole cluster.
func applyWhole(c Change, p *policy.Policy, cur Placement) (*policy.Policy, Placement, error) {
	np := clonePolicy(p)
	pl := Placement{}
	for _, v := range p.VMs {
		if cur == nil {
			if v.Host != "" {
				pl[v.Name] = v.Host
			}
		} else if h := cur[v.Name]; h != "" {
			pl[v.Name] = h
		}
	}
	old := Placement{}
	for k, v := range pl {
		old[k] = v
	}
	if c.Sub == "" && c.Field == "host" && p.VM(c.Target) != nil {
		if c.Value == "" {
			delete(pl, c.Target)
		} else {
			pl[c.Target] = c.Value
		}
	}
	if err := c.apply(np); err != nil {
		return nil, nil, fmt.Errorf("change %q: %v", c.Spec, err)
	}
	if reason := refusalWhole(p, old, np, pl, c); reason != "" {
		return nil, nil, &RefusedError{Spec: c.Spec, Reason: reason}
	}
	return np, pl, nil
}

func refusalWhole(p *policy.Policy, old Placement, np *policy.Policy, pl Placement, c Change) string {
	if v := np.VM(c.Target); v != nil {
		if why := settingRefusal(v); why != "" {
			return why
		}
		s := newState(np, pl, Demand{}, &Options{})
		for _, n := range v.NICs {
			var best int64
			for hi := range s.hosts {
				best = max(best, feasible.Room(&s.hosts[hi].fh, n.Uplink))
			}
			if int64(n.Reservation) > best {
				return fmt.Sprintf("%s reservation %s fits on no uplink of any host (largest vm budget %s)",
					policy.PortName(v.Name, n.Name), fmtRate(float64(n.Reservation)), fmtRate(float64(best)))
			}
		}
	}
	if c.Sub == "" && c.Field == "host" && c.Value != "" {
		rest := Placement{}
		for k, h := range pl {
			if k != c.Target {
				rest[k] = h
			}
		}
		s := newState(np, rest, Demand{}, &Options{})
		vi, hi := s.vmIdx[c.Target], s.hostIdx[c.Value]
		if old[c.Target] != c.Value && !s.fits(vi, hi) {
			return fmt.Sprintf("%s does not fit on %s: %s", c.Target, c.Value, strings.Join(s.shortfalls(vi, hi), "; "))
		}
	}
	before := map[string]bool{}
	for _, d := range Check(p, old, Options{}) {
		if d.Host == "" {
			before[d.Why] = true
		}
	}
	for _, d := range Check(np, pl, Options{}) {
		if d.Host == "" && !before[d.Why] && !isUplinkChange(c) {
			return d.Why
		}
	}
	return ""
}
