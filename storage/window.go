package storage

import (
	"math"

	"sluice/parda"
	"sluice/policy"
)

// uncontrolledWindow is the window of a datastore without SIOC.
const uncontrolledWindow = 256

// startWindow is the window SIOC starts from (clamped to [Min, Max]).
const startWindow = 32

// pardaController is the window control of a datastore with SIOC s:
// package parda's scaled law (parda.Controller.UpdateScaled) with the
// datastore's threshold and gains. The share term is a fraction b
// (ShareTerm) of the datastore's total window, split by active shares, and
// the threshold is lowered to (1−b)·L, so that the fixed point is
// latency = L exactly and windows in the ratio of the hosts' active
// shares, whatever the array's speed (docs/parda.md). Zero fields (a
// policy built in code) take parda's defaults, which are the policy's.
func pardaController(s policy.SIOC) *parda.Controller {
	th := s.CongestionThreshold
	if th <= 0 {
		th = policy.DefaultCongestionThreshold
	}
	return parda.New(parda.Config{ThresholdNs: float64(th.Nanoseconds()), Gamma: s.Gamma, ShareTerm: s.ShareTerm,
		Min: float64(s.MinWindow), Max: float64(s.MaxWindow)})
}

// initialWindow is the window a datastore under ctl starts with.
func initialWindow(ctl *parda.Controller) float64 {
	c := ctl.Config()
	return math.Min(math.Max(startWindow, c.Min), c.Max)
}

// periodInput is what one control period of one datastore decides from.
type periodInput struct {
	Host         string
	EndNs        int64 // end of the period, Unix ns (wall clock)
	PeriodNs     int64 // length of the period
	IOs          uint64
	NormLatSumNs float64 // Σ size-normalised device latency of IOs, ns
	ActiveShares float64 // shares of this host's disks with I/O in the period
	Window       float64 // this host's window during the period
	Peak         int     // most requests this host had outstanding at once
	// Recs are the records read from the stats region in slot order; this
	// host's own (from the last period) is replaced by this period's.
	Recs []statsRecord
}

// periodOutput is what one control period decided.
type periodOutput struct {
	Window  float64       // the window for the next period
	Publish statsRecord   // this host's record, for its slot
	View    datastoreView // the datastore as seen from all fresh records
}

// pardaStep is one control period of one datastore, without I/O: from this
// host's counters and the other hosts' records it computes the datastore
// view, the next window (ctl.UpdateScaled, not grown unless the window was
// filled: ctl.Hold; unchanged when ctl is nil, SIOC off) and the record to
// publish.
func pardaStep(ctl *parda.Controller, in periodInput) periodOutput {
	rec := statsRecord{Host: in.Host, PeriodEndNs: in.EndNs, PeriodNs: in.PeriodNs, IOs: in.IOs,
		NormLatSumNs: in.NormLatSumNs, Window: in.Window, ActiveShares: in.ActiveShares}
	recs := make([]statsRecord, 0, len(in.Recs)+1)
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
	out := periodOutput{Window: in.Window, Publish: rec, View: viewOf(recs, in.EndNs)}
	if ctl != nil {
		v := out.View
		out.Window = ctl.Hold(in.Window, ctl.UpdateScaled(in.Window, v.latNs, in.ActiveShares, v.totalShares, v.totalWindow), in.Peak)
	}
	return out
}
