package agent

import "sluice/alloc"

// Demand estimation, one rule for vNICs and for VMs' CPU: a consumer that
// was saturated in some interval of the last DemandWindowNs (it used at
// least SaturatedFraction of what it was guaranteed, or the kernel
// throttled it) may want more: unbounded demand. Otherwise its demand is
// Headroom × the most it used in that window plus a margin of the line
// (HeadroomOfLine of an uplink, CPUHeadroomOfCore of a core), so that a
// flow that is still ramping up (TCP) or a VM that is getting busier can
// grow by half its use per interval instead of being held where it is.
const (
	SaturatedFraction = 0.8
	Headroom          = 1.5
	HeadroomOfLine    = 0.02
	CPUHeadroomOfCore = 0.02
	// DemandWindowNs is how long a measurement counts for demand.
	DemandWindowNs = int64(1e9)
)

// demand is one consumer's recent use, in its unit (bits/s, MHz).
type demand struct {
	window     []float64 // use in the intervals of the last DemandWindowNs
	windowNs   []int64   // when each of those intervals ended
	satUntilNs int64     // saturated recently: unbounded demand until then
}

// add records the use of the interval ending at nowNs; saturated says
// that the consumer was held in it (used ≥ SaturatedFraction of its
// guarantee, or throttled).
func (d *demand) add(nowNs int64, used float64, saturated bool) {
	d.window = append(d.window, used)
	d.windowNs = append(d.windowNs, nowNs)
	for len(d.windowNs) > 0 && d.windowNs[0] <= nowNs-DemandWindowNs {
		d.window, d.windowNs = d.window[1:], d.windowNs[1:]
	}
	if saturated {
		d.saturate(nowNs)
	}
}

// saturate makes the demand unbounded for the next DemandWindowNs (a
// saturated consumer, or one that has just arrived).
func (d *demand) saturate(nowNs int64) { d.satUntilNs = nowNs + DemandWindowNs }

// peak is the most used in the window (0 when nothing was measured).
func (d *demand) peak() float64 {
	m := 0.0
	for _, v := range d.window {
		m = max(m, v)
	}
	return m
}

// saturated says whether the consumer was saturated within the last
// DemandWindowNs before nowNs.
func (d *demand) saturated(nowNs int64) bool { return nowNs < d.satUntilNs }

// estimate is the demand at nowNs: unbounded when nothing was measured
// yet or the consumer was recently saturated, else grown(peak, margin).
func (d *demand) estimate(nowNs int64, margin float64) float64 {
	if len(d.window) == 0 || d.saturated(nowNs) {
		return alloc.Inf
	}
	return grown(d.peak(), margin)
}

// grown is the demand of a consumer that used used: Headroom × used plus
// margin.
func grown(used, margin float64) float64 { return Headroom*used + margin }
