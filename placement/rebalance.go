package placement

import (
	"fmt"
	"sort"
)

// candidateHosts is how many of the most and of the least loaded hosts a
// rebalancing step considers as sources and destinations.
const candidateHosts = 8

// rebalance moves VMs while the imbalance exceeds the threshold's target,
// one best move at a time, at most o.MaxMoves. A move must remove at least
// the threshold's minimum gain, and its gain held for the rest of the
// interval must outweigh its migration time valued at that minimum gain:
//
//	gain ≥ minGain/n  and  gain × (IntervalS − costS) > minGain/n × costS
//
// The gain must also reach minGain with the VM's load on its destination
// DemandMargin higher than measured, so that a move that only mirrors the load
// (the VM's share of the difference between two hosts) within the noise of
// the measurement is not taken. No VM moves twice in a pass, VMs that migrated within the cooldown do not
// move, broken hosts are left to repair, and since every move strictly
// lowers the metric by at least minGain, a pass cannot undo its own moves;
// the minimum gain is the hysteresis that keeps passes from undoing each
// other's moves when the load is symmetric.
func (s *state) rebalance(o *Options) []Decision {
	th := thresholds[o.Threshold]
	if o.Threshold <= 1 || o.MaxMoves < 0 || len(s.hosts) < 2 {
		return nil
	}
	th.minGain /= float64(len(s.hosts))
	var ds []Decision
	movedNow := map[int]bool{}
	for len(ds) < o.MaxMoves {
		cur := s.bal.imbalance()
		if cur <= th.target {
			break
		}
		srcs, dsts := s.loadOrder()
		bv, bto := -1, -1
		var bnet, bgain, bcost float64
		for _, from := range srcs {
			if !s.hostOK(from) {
				continue
			}
			for _, vi := range s.hosts[from].vms {
				v := &s.vms[vi]
				if !v.migratable || movedNow[vi] || s.cooling(o, vi) {
					continue
				}
				for _, to := range dsts {
					if to == from || s.returning(o, vi, to) {
						continue
					}
					m, _ := s.bal.after(s, vi, from, to)
					gain := cur - m
					if gain < th.minGain {
						continue
					}
					// The gain must hold if the VM's demand was
					// measured DemandMargin too low.
					if s.bal.gainPessimistic(s, vi, from, to, o.DemandMargin) < th.minGain {
						continue
					}
					cost := s.costS(o, vi, from, to)
					net := gain*(o.IntervalS-cost) - th.minGain*cost
					if net <= 0 {
						continue
					}
					better := bv < 0 || net > bnet+1e-12 ||
						(net >= bnet-1e-12 && (cost < bcost || (cost == bcost && (vi < bv || (vi == bv && to < bto)))))
					if better && s.fits(vi, to) {
						bv, bto, bnet, bgain, bcost = vi, to, net, gain, cost
					}
				}
			}
		}
		if bv < 0 {
			break
		}
		from := s.vms[bv].host
		s.move(bv, bto)
		movedNow[bv] = true
		after := s.bal.imbalance()
		ds = append(ds, Decision{Kind: Rebalance, VM: s.vms[bv].name, From: s.hosts[from].name, To: s.hosts[bto].name,
			CostS: bcost, Gain: bgain,
			Why: fmt.Sprintf("rebalance: imbalance %.3f → %.3f (gain %.3f ≥ %.3f at threshold %d); cost %s (%s at %s) pays back within %s",
				cur, after, bgain, th.minGain, o.Threshold, fmtSeconds(bcost), fmtBytes(s.vms[bv].mem),
				fmtRate(s.vmotionBps(o, from, bto)), fmtSeconds(o.IntervalS))})
	}
	return ds
}

// cooling reports whether VM vi migrated less than the cooldown ago.
func (s *state) cooling(o *Options, vi int) bool {
	m, ok := o.History[s.vms[vi].name]
	return ok && o.NowNs-m.AtNs < o.CooldownNs
}

// returning reports whether moving VM vi to host to would take it back to
// the host it left less than ReturnNs ago.
func (s *state) returning(o *Options, vi, to int) bool {
	m, ok := o.History[s.vms[vi].name]
	return ok && m.From == s.hosts[to].name && o.NowNs-m.AtNs < o.ReturnNs
}

// loadOrder returns the hosts a rebalancing step moves VMs from and to.
// In a cluster of up to 2 × candidateHosts hosts, every host is both.
// Otherwise the sources are the candidateHosts most loaded hosts by each
// weighted resource and by their sum, and the destinations the
// candidateHosts least loaded ones by the same measures.
func (s *state) loadOrder() (srcs, dsts []int) {
	n := len(s.hosts)
	if n <= 2*candidateHosts {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		return all, all
	}
	inSrc, inDst := make([]bool, n), make([]bool, n)
	order := make([]int, n)
	key := make([]float64, n)
	pick := func(measure func(l *[nRes]float64) float64) {
		for hi := range s.hosts {
			order[hi] = hi
			l := loads(&s.hosts[hi])
			key[hi] = measure(&l)
		}
		sort.SliceStable(order, func(a, b int) bool { return key[order[a]] > key[order[b]] })
		for k := 0; k < candidateHosts; k++ {
			if hi := order[k]; !inSrc[hi] {
				inSrc[hi] = true
				srcs = append(srcs, hi)
			}
			if hi := order[n-1-k]; !inDst[hi] {
				inDst[hi] = true
				dsts = append(dsts, hi)
			}
		}
	}
	pick(func(l *[nRes]float64) float64 {
		var sum float64
		for r := 0; r < nRes; r++ {
			sum += s.bal.w[r] * l[r]
		}
		return sum
	})
	for r := 0; r < nRes; r++ {
		if s.bal.w[r] != 0 {
			pick(func(l *[nRes]float64) float64 { return l[r] })
		}
	}
	return srcs, dsts
}
