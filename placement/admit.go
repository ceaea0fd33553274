package placement

import (
	"fmt"
	"sort"

	"sluice/feasible"
)

// admitAll powers on every VM without a host, in file order: on the
// fitting host that leaves the cluster most balanced, or refused with the
// shortfall on each host.
func (s *state) admitAll(cur Placement) []Decision {
	var ds []Decision
	for vi := range s.vms {
		v := &s.vms[vi]
		if v.host >= 0 {
			continue
		}
		if cl := s.clusterShortfalls(vi); len(cl) > 0 {
			ds = append(ds, Decision{Kind: Refuse, VM: v.name,
				Why: "its reservations exceed a cluster-wide quota", Details: cl})
			continue
		}
		hi := s.bestHost(vi, -1)
		if hi < 0 {
			var det []string
			for h := range s.hosts {
				for _, sf := range s.shortfalls(vi, h) {
					det = append(det, s.hosts[h].name+": "+sf)
				}
			}
			ds = append(ds, Decision{Kind: Refuse, VM: v.name, Why: "its reservations fit on no host", Details: det})
			continue
		}
		was := ""
		if cur != nil {
			was = cur[v.name]
		} else {
			was = s.p.VMs[vi].Host
		}
		m, _ := s.bal.after(s, vi, -1, hi)
		why := fmt.Sprintf("fits; the most balanced choice (imbalance %.3f after)", m)
		if was != "" {
			why = fmt.Sprintf("host %q is not in the cluster; ", was) + why
		}
		s.place(vi, hi)
		ds = append(ds, Decision{Kind: Admit, VM: v.name, To: s.hosts[hi].name, Why: why})
	}
	return ds
}

// retryRefused retries, after rebalancing has moved VMs, the power-ons
// refused earlier in the pass; an admitted VM's refusal is replaced by the
// admission.
func (s *state) retryRefused(ds []Decision) []Decision {
	for i := range ds {
		if ds[i].Kind != Refuse {
			continue
		}
		vi := s.vmIdx[ds[i].VM]
		if len(s.clusterShortfalls(vi)) > 0 {
			continue
		}
		if hi := s.bestHost(vi, -1); hi >= 0 {
			m, _ := s.bal.after(s, vi, -1, hi)
			s.place(vi, hi)
			ds[i] = Decision{Kind: Admit, VM: ds[i].VM, To: s.hosts[hi].name,
				Why: fmt.Sprintf("fits once rebalancing has moved VMs; the most balanced choice (imbalance %.3f after)", m)}
		}
	}
	return ds
}

// clusterShortfalls lists the cluster-wide quotas (network pools, datastore
// IOPS) that VM vi, not placed, would exceed.
func (s *state) clusterShortfalls(vi int) []string {
	v := &s.vms[vi]
	var out []string
	need := map[int]int64{}
	for _, n := range v.nics {
		if n.pool >= 0 && n.resv > 0 {
			need[n.pool] += n.resv
		}
	}
	for _, pi := range sortedKeys(need) {
		if ok, why := s.pools[pi].q.Fit(need[pi]); !ok {
			out = append(out, why)
		}
	}
	needIO := map[int]int64{}
	for _, d := range v.iops {
		needIO[d.ds] += d.iops
	}
	for _, di := range sortedKeys(needIO) {
		if ok, why := s.dss[di].Fit(needIO[di]); !ok {
			out = append(out, why)
		}
	}
	return out
}

func sortedKeys(m map[int]int64) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// shortfalls lists why VM vi does not fit on host hi, one line per
// resource, naming what it needs, what is free and the shortfall
// (feasible.Why).
func (s *state) shortfalls(vi, hi int) []string {
	v, h := &s.vms[vi], &s.hosts[hi]
	var out []string
	for _, r := range feasible.Why(&h.fh, &h.load, &v.fv, &s.scratch) {
		out = append(out, r.Text)
	}
	if len(out) == 0 {
		out = append(out, "does not fit")
	}
	return out
}
