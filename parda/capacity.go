package parda

import "slices"

// Capacity estimates what a datastore serves from the periods in which it
// was congested (its latency at or above the threshold): in those the
// datastore served as fast as it could at that latency, so what all hosts
// did together (View.IOPS) is its capacity. The estimate is the median of
// the last CapacityPeriods congested periods, so that a period cut short,
// a host's record missing or one burst does not move it; it needs
// MinCapacityPeriods of them. Periods below the threshold say nothing of
// the capacity (the hosts asked for less) and are not counted.
//
// A Capacity is a value, kept in a driver's state between periods.
type Capacity struct {
	ring   [CapacityPeriods]float64
	n      int   // congested periods seen in all
	LastNs int64 // end of the last congested period (0: none)
}

// CapacityPeriods is how many of the last congested periods the estimate
// takes the median of; MinCapacityPeriods is how many it needs.
const (
	CapacityPeriods    = 60
	MinCapacityPeriods = 5
)

// Observe counts the period ending at endNs if the datastore was
// congested in it: its latency (v.LatNs) at or above thresholdNs, with
// I/O done.
func (c Capacity) Observe(v View, thresholdNs float64, endNs int64) Capacity {
	if thresholdNs <= 0 || v.IOPS <= 0 || v.LatNs < thresholdNs {
		return c
	}
	c.ring[c.n%CapacityPeriods] = v.IOPS
	c.n++
	c.LastNs = endNs
	return c
}

// Periods is how many congested periods the estimate is taken over.
func (c Capacity) Periods() int { return min(c.n, CapacityPeriods) }

// Estimate returns the datastore's measured capacity in IOPS, and false
// until MinCapacityPeriods congested periods were seen.
func (c Capacity) Estimate() (float64, bool) {
	k := c.Periods()
	if k < MinCapacityPeriods {
		return 0, false
	}
	v := slices.Clone(c.ring[:k])
	slices.Sort(v)
	if k%2 == 1 {
		return v[k/2], true
	}
	return (v[k/2-1] + v[k/2]) / 2, true
}
