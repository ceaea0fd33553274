package placement

import "math"

// The imbalance metric, as DRS computes it: for each resource, the standard
// deviation over hosts of the hosts' normalised entitlements (the sum of
// their VMs' entitlements divided by the host's capacity); the metric is
// the weighted sum over resources. CPU and memory weigh 1; network (the
// vNICs' entitlements over the usable uplink capacity) weighs
// Options.NetworkWeight, 0 by default, because DRS balances CPU and memory
// and treats bandwidth reservations as constraints (seed 000).
//
// A fourth quantity, the share of each host's vNIC reservation budget that
// is reserved, is kept beside the metric: initial placement uses it to break
// ties between hosts that the metric cannot tell apart.

const (
	resCPU = iota
	resMem
	resNet
	resNetResv // tie-break only
	nRes
)

// balance holds, per resource, the sum and the sum of squares of the hosts'
// normalised loads, so that the effect of a move costs O(1).
type balance struct {
	w      [nRes]float64
	s1, s2 [nRes]float64
	n      float64
}

func (b *balance) init(s *state, o *Options) {
	b.w = [nRes]float64{1, 1, o.NetworkWeight, 0}
	b.n = float64(len(s.hosts))
	b.s1, b.s2 = [nRes]float64{}, [nRes]float64{}
	for hi := range s.hosts {
		b.add(s, hi)
	}
}

// loads are the normalised loads of host h.
func loads(h *host) [nRes]float64 {
	return [nRes]float64{modelled(h.cpuLoad, h.cpuCap), modelled(h.memLoad, h.memCap),
		ratio(h.netLoad, h.netCap), ratio(float64(h.load.NetBps), h.budget)}
}

// modelled is load/capacity for a resource that a host may leave out
// (CPU, memory: capacity 0 is "not modelled"): such a host does not take
// part in balancing it.
func modelled(load, capacity float64) float64 {
	if capacity > 0 {
		return load / capacity
	}
	return 0
}

// ratio is load/capacity; a host without capacity counts as full when it
// carries any load.
func ratio(load, capacity float64) float64 {
	if capacity > 0 {
		return load / capacity
	}
	if load > 0 {
		return 1
	}
	return 0
}

func (b *balance) add(s *state, hi int) {
	l := loads(&s.hosts[hi])
	for r := range l {
		b.s1[r] += l[r]
		b.s2[r] += l[r] * l[r]
	}
}

func (b *balance) remove(s *state, hi int) {
	l := loads(&s.hosts[hi])
	for r := range l {
		b.s1[r] -= l[r]
		b.s2[r] -= l[r] * l[r]
	}
}

func (b *balance) std(s1, s2 *[nRes]float64, r int) float64 {
	if b.n == 0 {
		return 0
	}
	m := s1[r] / b.n
	v := s2[r]/b.n - m*m
	if v <= 0 {
		return 0
	}
	return math.Sqrt(v)
}

// imbalance is the metric for the present state.
func (b *balance) imbalance() float64 {
	var sum float64
	for r := 0; r < nRes; r++ {
		if b.w[r] != 0 {
			sum += b.w[r] * b.std(&b.s1, &b.s2, r)
		}
	}
	return sum
}

// tieBreak is the spread of the hosts' reserved share of their vNIC
// reservation budgets.
func (b *balance) tieBreak() float64 { return b.std(&b.s1, &b.s2, resNetResv) }

// after returns the metric and the tie-break value as they would be if VM
// vi moved from host from (-1: not placed) to host to. It changes nothing.
func (b *balance) after(s *state, vi, from, to int) (metric, tie float64) {
	s1, s2 := b.s1, b.s2
	if from >= 0 {
		b.shift(s, &s1, &s2, from, vi, -1)
	}
	b.shift(s, &s1, &s2, to, vi, +1)
	return b.metric(&s1, &s2), b.std(&s1, &s2, resNetResv)
}

// gainPessimistic is the gain in the metric of moving VM vi from host
// from to host to if the VM turned out to load its destination 1+m times
// what was measured on its source. It changes nothing.
func (b *balance) gainPessimistic(s *state, vi, from, to int, m float64) float64 {
	s1, s2 := b.s1, b.s2
	b.shift(s, &s1, &s2, from, vi, -1)
	b.shift(s, &s1, &s2, to, vi, 1+m)
	return b.metric(&b.s1, &b.s2) - b.metric(&s1, &s2)
}

// shift updates the sums s1, s2 as if host hi (as it is now) gained f
// times VM vi's load (f < 0: lost). Shift each host at most once per sums.
func (b *balance) shift(s *state, s1, s2 *[nRes]float64, hi, vi int, f float64) {
	h, v := &s.hosts[hi], &s.vms[vi]
	old := loads(h)
	nl := [nRes]float64{modelled(h.cpuLoad+f*v.cpuLoad, h.cpuCap), modelled(h.memLoad+f*v.memLoad, h.memCap),
		ratio(h.netLoad+f*v.netLoad, h.netCap), ratio(float64(h.load.NetBps)+f*v.netResv, h.budget)}
	for r := range nl {
		s1[r] += nl[r] - old[r]
		s2[r] += nl[r]*nl[r] - old[r]*old[r]
	}
}

func (b *balance) metric(s1, s2 *[nRes]float64) float64 {
	var m float64
	for r := 0; r < nRes; r++ {
		if b.w[r] != 0 {
			m += b.w[r] * b.std(s1, s2, r)
		}
	}
	return m
}
