package placement

import (
	"fmt"
	"math"
	"sort"
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
	need := map[int]float64{}
	for _, n := range v.nics {
		if n.pool >= 0 && n.resv > 0 {
			need[n.pool] += n.resv
		}
	}
	for _, pi := range sortedKeys(need) {
		pl := &s.pools[pi]
		if free := pl.quota - pl.used; need[pi] > free+1e-6 {
			out = append(out, fmt.Sprintf("pool %s: needs %s, free %s of quota %s (short %s)",
				pl.name, fmtRate(need[pi]), fmtRate(math.Max(free, 0)), fmtRate(pl.quota), fmtRate(need[pi]-math.Max(free, 0))))
		}
	}
	needIO := map[int]float64{}
	for _, d := range v.iops {
		needIO[d.ds] += d.iops
	}
	for _, di := range sortedKeys(needIO) {
		d := &s.dss[di]
		if free := d.cap - d.used; needIO[di] > free+1e-6 {
			out = append(out, fmt.Sprintf("datastore %s: needs %s, free %s of %s (short %s)",
				d.name, fmtIOPS(needIO[di]), fmtIOPS(math.Max(free, 0)), fmtIOPS(d.cap), fmtIOPS(needIO[di]-math.Max(free, 0))))
		}
	}
	return out
}

func sortedKeys(m map[int]float64) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// shortfalls lists why VM vi does not fit on host hi, one line per
// resource, naming what it needs, what is free and the shortfall.
func (s *state) shortfalls(vi, hi int) []string {
	v, h := &s.vms[vi], &s.hosts[hi]
	var out []string
	if !s.hostOK(hi) {
		out = append(out, "the host cannot meet its own VMs' reservations")
	}
	if v.vcpus > h.cores {
		out = append(out, fmt.Sprintf("cpu: %d vCPUs > %d cores", v.vcpus, h.cores))
	}
	if free := h.cpuCap - h.cpuResv; v.cpuResv > free+1e-6 {
		out = append(out, fmt.Sprintf("cpu: needs %s reserved, free %s (short %s)", fmtMHz(v.cpuResv), fmtMHz(math.Max(free, 0)), fmtMHz(v.cpuResv-math.Max(free, 0))))
	}
	if free := h.memCap - h.mem; v.mem > free+0.5 {
		out = append(out, fmt.Sprintf("memory: needs %s, free %s (short %s)", fmtBytes(v.mem), fmtBytes(math.Max(free, 0)), fmtBytes(v.mem-math.Max(free, 0))))
	}
	for _, n := range v.nics {
		if n.pin != "" && uplinkByName(h, n.pin) < 0 {
			out = append(out, fmt.Sprintf("network: %s is pinned to uplink %s, which the host lacks or has lost", n.name, n.pin))
		}
	}
	if v.netResv > 0 {
		free := h.budget - h.netResv
		if v.netResv > free+1e-6 {
			out = append(out, fmt.Sprintf("network: needs %s of vNIC reservations, free %s (short %s)",
				fmtRate(v.netResv), fmtRate(math.Max(free, 0)), fmtRate(v.netResv-math.Max(free, 0))))
		} else if s.hostOK(hi) && !s.tryPack(vi, hi) {
			big, most, mostName := 0.0, 0.0, "none"
			for _, n := range v.nics {
				big = math.Max(big, n.resv)
			}
			for _, u := range h.uplinks {
				if !u.down && u.budget-u.used > most {
					most, mostName = u.budget-u.used, u.name
				}
			}
			out = append(out, fmt.Sprintf("network: a vNIC needs %s on one uplink, the most free is %s on %s (short %s)",
				fmtRate(big), fmtRate(most), mostName, fmtRate(big-most)))
		}
	}
	if len(out) == 0 {
		out = append(out, "does not fit")
	}
	return out
}
