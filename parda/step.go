package parda

import "math"

// Record is one host's entry in a datastore's shared stats (the stats
// volume of the storage gateway, the stats directory of the throttle
// driver): the datastore I/O the host completed in its last period.
type Record struct {
	Host         string
	PeriodEndNs  int64 // wall clock, Unix ns
	PeriodNs     int64
	IOs          uint64
	NormLatSumNs float64 // Σ size-normalised device latency of IOs, ns
	Window       float64
	ActiveShares float64
}

// View is what every host derives from the fresh records of a datastore
// (those whose period ended within 3 of their periods before now).
type View struct {
	LatNs       float64 // IOPS-weighted mean normalised latency; 0: no I/O
	IOPS        float64 // Σ of the hosts' I/Os per second in their periods
	Hosts       int
	TotalShares float64 // Σ active shares
	TotalWindow float64 // Σ windows of hosts with active shares
}

// ViewOf returns the datastore as the fresh records at nowNs show it.
func ViewOf(recs []Record, nowNs int64) View {
	var v View
	var reports []HostReport
	for _, r := range recs {
		if r.PeriodNs <= 0 || nowNs-r.PeriodEndNs > 3*r.PeriodNs {
			continue
		}
		v.Hosts++
		v.IOPS += float64(r.IOs) / (float64(r.PeriodNs) / 1e9)
		if r.IOs > 0 {
			// Latencies are normalised per I/O already (MeanBytes 0).
			reports = append(reports, HostReport{IOs: float64(r.IOs), LatencyNs: r.NormLatSumNs / float64(r.IOs)})
		}
		if r.ActiveShares > 0 {
			v.TotalShares += r.ActiveShares
			v.TotalWindow += r.Window
		}
	}
	v.LatNs = DefaultSizeModel.DatastoreLatency(reports)
	return v
}

// StartWindow is the window SIOC starts from (clamped to [Min, Max]).
const StartWindow = 32

// InitialWindow is the window a datastore under c starts with.
func (c *Controller) InitialWindow() float64 {
	return math.Min(math.Max(StartWindow, c.cfg.Min), c.cfg.Max)
}

// StepInput is what one control period of one host on one datastore
// decides from.
type StepInput struct {
	Host         string
	EndNs        int64 // end of the period, Unix ns (wall clock)
	PeriodNs     int64 // length of the period
	IOs          uint64
	NormLatSumNs float64 // Σ size-normalised device latency of IOs, ns
	ActiveShares float64 // shares of this host's disks with I/O in the period
	Window       float64 // this host's window during the period
	Peak         int     // most requests this host had outstanding at once
	// Recs are the records read from the shared stats; this host's own
	// (from the last period) is replaced by this period's.
	Recs []Record
}

// StepOutput is what one control period decided.
type StepOutput struct {
	Window  float64 // the window for the next period
	Publish Record  // this host's record, to write to the shared stats
	View    View    // the datastore as seen from all fresh records
}

// Step is one control period of one host on one datastore, without I/O:
// from this host's counters and the other hosts' records it computes the
// datastore view, the next window (c.UpdateScaled, not grown unless the
// window was filled: c.Hold; unchanged when c is nil, SIOC off) and the
// record to publish. The storage gateway and the throttle driver both
// run their periods through it.
func Step(c *Controller, in StepInput) StepOutput {
	rec := Record{Host: in.Host, PeriodEndNs: in.EndNs, PeriodNs: in.PeriodNs, IOs: in.IOs,
		NormLatSumNs: in.NormLatSumNs, Window: in.Window, ActiveShares: in.ActiveShares}
	recs := make([]Record, 0, len(in.Recs)+1)
	own := false
	for _, r := range in.Recs {
		if r.Host == in.Host {
			if own {
				continue
			}
			r, own = rec, true
		}
		recs = append(recs, r)
	}
	if !own {
		recs = append(recs, rec)
	}
	out := StepOutput{Window: in.Window, Publish: rec, View: ViewOf(recs, in.EndNs)}
	if c != nil {
		v := out.View
		out.Window = c.Hold(in.Window, c.UpdateScaled(in.Window, v.LatNs, in.ActiveShares, v.TotalShares, v.TotalWindow), in.Peak)
	}
	return out
}
