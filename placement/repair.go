package placement

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"sluice/feasible"
)

// clusterFaults lists what no migration can mend: traffic class
// reservations over the cap of an uplink, network pools whose quota exceeds
// the cap of the uplinks they span or whose vNICs reserve more than the
// quota, datastores whose disks reserve more IOPS than the array serves.
func (s *state) clusterFaults() []Decision {
	var ds []Decision
	for hi := range s.hosts {
		if e := s.hosts[hi].classErr; e != "" {
			ds = append(ds, Decision{Kind: Fault, Why: "host " + s.hosts[hi].name + ": " + e})
		}
	}
	classes := s.p.Classes()
	for pi := range s.pools {
		pl := &s.pools[pi]
		var speeds []int64
		for _, hi := range pl.hosts {
			for _, u := range s.hosts[hi].uplinks {
				if !u.down {
					speeds = append(speeds, int64(u.speed))
				}
			}
		}
		if ok, why := classes.PoolSpan(pl.q.Name, pl.q.Cap, len(pl.hosts), speeds); !ok {
			ds = append(ds, Decision{Kind: Fault, Why: why})
		}
		if !pl.q.Holds() {
			ds = append(ds, Decision{Kind: Fault, Why: pl.q.Broken()})
		}
	}
	for di := range s.dss {
		if !s.dss[di].Holds() {
			ds = append(ds, Decision{Kind: Fault, Why: s.dss[di].Broken()})
		}
	}
	return ds
}

// faultOf is the Fault decision of a broken host.
func (s *state) faultOf(hi int) Decision {
	h := &s.hosts[hi]
	return Decision{Kind: Fault, Host: h.name,
		Why: "host " + h.name + " cannot meet the reservations of its VMs", Details: feasible.Problems(&h.fh, &h.load, s.feasibleVMs(hi))}
}

// sortedVMs returns the VMs of h in file order.
func (h *host) sortedVMs() []int {
	vs := append([]int(nil), h.vms...)
	sort.Ints(vs)
	return vs
}

// vmotionBps is the bandwidth a migration from host a to host b copies at.
func (s *state) vmotionBps(o *Options, a, b int) float64 {
	if o.VMotionBps > 0 {
		return o.VMotionBps
	}
	if s.vmotionLimit > 0 {
		return s.vmotionLimit
	}
	bps := math.Inf(1)
	for _, hi := range [2]int{a, b} {
		if hi < 0 {
			continue
		}
		for _, u := range s.hosts[hi].uplinks {
			if !u.down {
				bps = math.Min(bps, u.usable)
				break
			}
		}
	}
	if math.IsInf(bps, 1) || bps <= 0 {
		bps = 10e9
	}
	return bps
}

// costS is the time in seconds to migrate VM vi from host a to host b:
// its memory copied at the vMotion bandwidth.
func (s *state) costS(o *Options, vi, a, b int) float64 {
	return s.vms[vi].mem * 8 / s.vmotionBps(o, a, b)
}

// bestHost is the host VM vi fits on that leaves the cluster most
// balanced (ties: the lesser spread of reserved network budget, then file
// order), or -1. exclude is a host not to consider.
func (s *state) bestHost(vi, exclude int) int {
	best := -1
	var bm, bt float64
	from := s.vms[vi].host
	for hi := range s.hosts {
		if hi == exclude || !s.fits(vi, hi) {
			continue
		}
		m, t := s.bal.after(s, vi, from, hi)
		if best < 0 || m < bm-1e-12 || (m <= bm+1e-12 && t < bt-1e-12) {
			best, bm, bt = hi, m, t
		}
	}
	return best
}

// repairAll repairs every broken host, in file order.
func (s *state) repairAll(o *Options) []Decision {
	var ds []Decision
	for hi := range s.hosts {
		if s.hostOK(hi) {
			continue
		}
		ds = append(ds, s.faultOf(hi))
		ds = append(ds, s.repairHost(o, hi)...)
	}
	return ds
}

// repairHost finds migrations off broken host hi that restore every
// reservation on it: the cheapest single move if one exists, else moves
// chosen greedily by how much of the overload they remove per second of
// migration, pruned of any move the repair turns out not to need. It
// undoes everything and returns a NoRepair decision when that fails.
func (s *state) repairHost(o *Options, hi int) []Decision {
	h := &s.hosts[hi]
	var cands, pinned []int
	for _, vi := range h.sortedVMs() {
		if s.vms[vi].migratable {
			cands = append(cands, vi)
		} else {
			pinned = append(pinned, vi)
		}
	}
	// One move? Among the VMs whose leaving alone mends the host, the
	// cheapest (least memory to copy) that fits elsewhere; equally cheap
	// ones are ranked by repairMove.better.
	var fixers []int
	for _, vi := range cands {
		if _, ok := s.without(hi, vi); ok {
			fixers = append(fixers, vi)
		}
	}
	sort.SliceStable(fixers, func(a, b int) bool { return s.vms[fixers[a]].mem < s.vms[fixers[b]].mem })
	var best *repairMove
	for _, vi := range fixers {
		if best != nil && s.vms[vi].mem > s.vms[best.vi].mem {
			break
		}
		if to := s.bestHost(vi, hi); to >= 0 {
			m, t := s.bal.after(s, vi, hi, to)
			c := repairMove{vi, to, s.costS(o, vi, hi, to), m, t, s.vms[vi].changed, s.size(vi, hi)}
			if best == nil || c.better(best) {
				b := c
				best = &b
			}
		}
	}
	if best != nil {
		s.move(best.vi, best.to)
		return []Decision{s.repairDecision(o, best.vi, hi, best.to, 1)}
	}
	// Greedy: the VM that removes the most overload per second of
	// migration and fits elsewhere, until the host is mended; then prune.
	var moved []int
	type scored struct {
		vi    int
		score float64
	}
	for !s.hostOK(hi) {
		before := s.overload(hi)
		var sc []scored
		for _, vi := range cands {
			if s.vms[vi].host != hi {
				continue
			}
			if over, _ := s.without(hi, vi); before-over > 1e-9 {
				sc = append(sc, scored{vi, (before - over) / (s.costS(o, vi, hi, -1) + 1e-3)})
			}
		}
		sort.SliceStable(sc, func(a, b int) bool {
			if sc[a].score != sc[b].score {
				return sc[a].score > sc[b].score
			}
			return s.vms[sc[a].vi].changed && !s.vms[sc[b].vi].changed
		})
		bi, bto := -1, -1
		for _, c := range sc {
			if to := s.bestHost(c.vi, hi); to >= 0 {
				bi, bto = c.vi, to
				break
			}
		}
		if bi < 0 {
			break
		}
		s.move(bi, bto)
		moved = append(moved, bi)
	}
	if !s.hostOK(hi) {
		for k := len(moved) - 1; k >= 0; k-- {
			s.move(moved[k], hi)
		}
		why := "no set of migrations found restores every reservation"
		switch {
		case len(cands) == 0:
			why = "no VM on it can migrate (not migratable: " + s.names(pinned) + ")"
		case len(pinned) > 0:
			why += "; not migratable: " + s.names(pinned)
		}
		return []Decision{{Kind: NoRepair, Host: h.name, Why: why}}
	}
	// Prune moves the repair does not need (latest choices first).
	keep := make([]bool, len(moved))
	for k := range moved {
		keep[k] = true
	}
	for k := len(moved) - 1; k >= 0; k-- {
		vi := moved[k]
		if s.fits(vi, hi) {
			s.move(vi, hi)
			keep[k] = false
		}
	}
	n := 0
	for _, kp := range keep {
		if kp {
			n++
		}
	}
	var ds []Decision
	for k, vi := range moved {
		if keep[k] {
			ds = append(ds, s.repairDecision(o, vi, hi, s.vms[vi].host, n))
		}
	}
	return ds
}

// repairMove is a candidate single-move repair.
type repairMove struct {
	vi, to  int
	cost    float64 // seconds
	m, t    float64 // imbalance metric and tie-break after the move
	changed bool
	size    float64 // the VM's reservations relative to the broken host
}

// better orders single-move repairs: cheaper first, then the VM whose
// settings changed, then the more balanced result, then the smaller VM
// (the larger stays put), then file order.
func (c repairMove) better(b *repairMove) bool {
	if math.Abs(c.cost-b.cost) > 1e-9*math.Max(c.cost, b.cost) {
		return c.cost < b.cost
	}
	if c.changed != b.changed {
		return c.changed
	}
	if math.Abs(c.m-b.m) > 1e-12 {
		return c.m < b.m
	}
	if math.Abs(c.size-b.size) > 1e-12 {
		return c.size < b.size
	}
	if math.Abs(c.t-b.t) > 1e-12 {
		return c.t < b.t
	}
	return c.vi < b.vi
}

// without returns the overload of host hi if VM vi (on it) left, and
// whether the host would then meet every reservation. It changes nothing.
func (s *state) without(hi, vi int) (over float64, ok bool) {
	h, v := &s.hosts[hi], &s.vms[vi]
	l := feasible.Without(&h.fh, &h.load, &v.fv, &s.scratch)
	return s.overloadOf(h, l), feasible.Holds(&h.fh, l)
}

// size is VM vi's reservations relative to host hi's capacities: CPU,
// memory and vNIC reservations, each as a fraction of the host's.
func (s *state) size(vi, hi int) float64 {
	v, h := &s.vms[vi], &s.hosts[hi]
	return ratio(float64(v.fv.ReservedMHz(&h.fh)), h.cpuCap) + ratio(v.mem, h.memCap) + ratio(v.netResv, h.budget)
}

// overload measures how far host hi is over its capacities: the relative
// excess of CPU reservations, memory and vNIC reservations (of the
// resources the host models), plus one per VM with more vCPUs than cores,
// plus a little when the vNICs cannot be packed although their sum fits.
func (s *state) overload(hi int) float64 {
	h := &s.hosts[hi]
	return s.overloadOf(h, &h.load)
}

// overloadOf is the overload of host h with load l.
func (s *state) overloadOf(h *host, l *feasible.Load) float64 {
	var o float64
	if h.cpuCap > 0 {
		o += math.Max(0, float64(l.CPUMHz)-h.cpuCap) / h.cpuCap
	}
	if h.memCap > 0 {
		o += math.Max(0, float64(l.MemoryBytes)-h.memCap) / h.memCap
	}
	o += float64(l.Wide)
	if h.fh.Cores > 0 {
		// One per core that latency-sensitive VMs pin beyond what the
		// host gives them.
		o += float64(max(0, l.PinnedCores-(h.fh.Cores-h.fh.HostCores)))
	}
	if net := float64(l.NetBps); net > h.budget {
		o += (net - h.budget) / math.Max(h.budget, 1e6)
	} else if l.Misfits(&h.fh) > 0 {
		o += 1e-3
	}
	return o
}

func (s *state) repairDecision(o *Options, vi, from, to int, n int) Decision {
	cost := s.costS(o, vi, from, to)
	moves := "1 move"
	if n > 1 {
		moves = fmt.Sprintf("%d moves", n)
	}
	why := fmt.Sprintf("repairs %s: %s restore every reservation; cost %s (%s at %s)",
		s.hosts[from].name, moves, fmtSeconds(cost), fmtBytes(s.vms[vi].mem), fmtRate(s.vmotionBps(o, from, to)))
	if n == 1 {
		why = strings.Replace(why, "restore", "restores", 1)
	}
	if s.vms[vi].changed {
		why += "; its settings just changed"
	}
	return Decision{Kind: Repair, VM: s.vms[vi].name, From: s.hosts[from].name, To: s.hosts[to].name, Why: why, CostS: cost}
}

// names lists VM names.
func (s *state) names(vis []int) string {
	ns := make([]string, len(vis))
	for i, vi := range vis {
		ns[i] = s.vms[vi].name
	}
	return strings.Join(ns, ", ")
}
