// Package throttle is the throttle driver's control period, without I/O:
// storage I/O control for the disks QEMU already has, with no proxy on
// the I/O path. Every period the host's agent reads each disk's cumulative
// counters from QEMU (operations, bytes, total time), and Step turns them,
// the disks' reservation, shares and limit, the other hosts' records of
// the datastore and the host's PARDA window into one QEMU throttle per
// disk (total IOPS and bytes per second).
//
// The rules are the project's own, not copies: the host's window is
// package parda's (parda.Step: the datastore-wide latency from every
// host's record, the scaled law), the split among disks is the storage
// derivation of package entitle (entitle.StorageRoot, entitle.DiskNode:
// mClock's floor semantics) that the gateway, the simulator and explain
// use. What is this package's own is turning counters into measurements
// and a window into a budget in IOPS, and entitlements into throttles.
//
// throttle never reads a clock, a file or libvirt: time and counters come
// in as values, throttles to set and the record to publish go out as
// values (package virt reads and sets them, package agent runs the
// period).
package throttle

import (
	"fmt"
	"math"
	"slices"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/mclock"
	"sluice/parda"
)

// UnitBytes is the size that counts as one I/O: mClock's (a request costs
// one unit per started 32 KiB in the gateway). QEMU is told the same with
// size_iops_sec, so an IOPS throttle counts the same units.
const UnitBytes = mclock.DefaultChunkBytes

// boundFraction: a disk that did at least this fraction of its throttle
// in a period was held by it: it wants more (its demand is unbounded).
const boundFraction = 0.9

// minStep and maxStep bound the factor by which the datastore's latency
// moves the host's window in a period (parda.Config.MinStep, MaxStep).
const (
	minStep = 0.7
	maxStep = 1.15
)

// changeFraction: a throttle is set again only when it moves by more than
// this fraction (and at least by 1 IOPS), so that noise in the measured
// latency does not rewrite every disk's throttle every period.
const changeFraction = 0.02

// Counters are one disk's cumulative counters as QEMU reports them since
// the disk appeared in its QEMU process (reads, writes and flushes
// together).
type Counters struct {
	Ops    uint64
	Bytes  uint64
	TimeNs uint64 // total time of the Ops, QEMU's view (its throttle's queue included)
}

// Disk is one disk of this host on the datastore, as read this period.
type Disk struct {
	Spec     entitle.DiskSpec // Name is VM/DISK; R, S, L in IOPS
	Counters Counters
}

// Limits is one disk's QEMU throttle (libvirt's block I/O tune). Zero
// IOPS means no throttle (QEMU's 0: unlimited).
type Limits struct {
	IOPS       int64 // total_iops_sec
	BytesPerS  int64 // total_bytes_sec: IOPS units of UnitBytes
	MaxIOPS    int64 // total_iops_sec_max: the burst rate (the driver sets none: an operator's, given back)
	MaxBytes   int64 // total_bytes_sec_max
	MaxLengthS int64 // the burst's length in seconds
	SizeIOPS   int64 // size_iops_sec: UnitBytes
}

// DiskState is what the driver remembers of a disk between periods.
type DiskState struct {
	Last Counters
	Set  Limits // the throttle last set
	// Applied says Set is in QEMU (false after a counter reset: a new
	// QEMU process starts from the domain's own tune).
	Applied bool
}

// State is what the driver remembers of one datastore between periods.
// The zero State is a fresh start.
type State struct {
	Window float64 // the host's PARDA window (0: not started)
	// LatNs is the last device latency measured on this host (0: none
	// yet), used to turn the window into IOPS in a period without one.
	LatNs float64
	Disks map[string]DiskState
	// Capacity is the datastore's capacity as measured from the periods
	// it was congested in (SIOC on): what admission may count on when
	// the policy declares none.
	Capacity parda.Capacity
}

// Input is one period of one datastore on one host.
type Input struct {
	Host     string
	EndNs    int64 // end of the period, Unix ns (wall clock)
	PeriodNs int64
	Disks    []Disk         // the disks present now; a disk missing is gone
	Recs     []parda.Record // the datastore's records, read this period
	// Probe is the datastore's latency as the host's own small reads of
	// it saw it in the period, below QEMU's throttles; nil when the host
	// does not probe. QEMU counts the time a request waits in its
	// throttle's queue in the disk's latency, so with a probe the host's
	// latency is the probe's; without one it is the latency of the disks
	// their throttle did not hold.
	Probe *Probe
}

// Probe is a period's probes of the datastore: N reads of ProbeBytes
// each, their latencies summing to LatSumNs.
type Probe struct {
	N        int
	LatSumNs float64
}

// ProbeBytes is the size of a probe read.
const ProbeBytes = 4096

// DiskResult is one disk's period: what it did, what it is entitled to,
// the throttle it gets and why.
type DiskResult struct {
	Name        string
	Spec        entitle.DiskSpec
	IOPS        float64 // units of UnitBytes per second done in the period
	Bytes       float64 // bytes per second
	LatencyNs   float64 // mean latency QEMU saw (0: no I/O)
	Bound       bool    // held by its throttle: its demand is unbounded
	New         bool    // first period: no rate yet
	Reset       bool    // counters went back: a new QEMU process
	DemandIOPS  float64 // alloc.Inf: unbounded
	Entitlement float64 // of the budget, with the measured demands
	Throttle    Limits
	Change      bool   // Throttle must be set in QEMU this period
	Why         string // the reason of the entitlement (alloc.Reason)
}

// Output is what one period decided.
type Output struct {
	State   State
	Disks   []DiskResult // in Input order
	Gone    []string     // disks that were known and are no longer present
	Publish parda.Record // this host's record for the datastore's stats
	View    parda.View
	// BudgetIOPS is the host's budget on the datastore: its window over
	// the congestion threshold (alloc.Inf without SIOC).
	BudgetIOPS float64
	// HostLatNs is the host's latency of the datastore in the period (its
	// probes', else its unheld disks'); 0 when none was measured.
	HostLatNs float64
}

// Step runs one control period. ctl is the datastore's PARDA control
// (policy.SIOC.Controller), nil when SIOC is off: then only limits are
// set (the budget is unbounded). st is the previous period's state.
func Step(ctl *parda.Controller, st State, in Input) Output {
	next := State{Window: st.Window, LatNs: st.LatNs, Disks: make(map[string]DiskState, len(in.Disks)), Capacity: st.Capacity}
	if ctl != nil && next.Window == 0 {
		next.Window = ctl.InitialWindow()
	}
	periodS := float64(in.PeriodNs) / 1e9
	out := Output{Disks: make([]DiskResult, len(in.Disks))}

	// Measure: rates from counter deltas; the host's device latency from
	// the disks their throttle did not hold (QEMU counts the time a
	// request waits in its throttle's queue in the disk's latency, so a
	// held disk's latency is mostly that wait).
	var ios, latSumNs, activeShares, boundIOs, boundLatSumNs float64
	sampled := make([]bool, len(in.Disks))
	for i, d := range in.Disks {
		r := &out.Disks[i]
		r.Name, r.Spec = d.Spec.Name, d.Spec
		prev, known := st.Disks[d.Spec.Name]
		var delta Counters
		switch {
		case !known:
			r.New = true
		case d.Counters.Ops < prev.Last.Ops || d.Counters.Bytes < prev.Last.Bytes || d.Counters.TimeNs < prev.Last.TimeNs:
			r.Reset, delta = true, d.Counters // counted from 0 since the reset
			prev.Applied = false
		default:
			delta = Counters{Ops: d.Counters.Ops - prev.Last.Ops, Bytes: d.Counters.Bytes - prev.Last.Bytes, TimeNs: d.Counters.TimeNs - prev.Last.TimeNs}
		}
		if periodS > 0 {
			r.IOPS = math.Max(float64(delta.Ops), float64(delta.Bytes)/UnitBytes) / periodS
			r.Bytes = float64(delta.Bytes) / periodS
		}
		if delta.Ops > 0 {
			r.LatencyNs = float64(delta.TimeNs) / float64(delta.Ops)
			activeShares += math.Max(d.Spec.Shares, 1)
		}
		r.Bound = r.New || (prev.Applied && prev.Set.IOPS > 0 && r.IOPS >= boundFraction*float64(prev.Set.IOPS))
		switch {
		case delta.Ops == 0 || r.Reset:
		case !r.Bound:
			ios += float64(delta.Ops)
			latSumNs += float64(delta.TimeNs)
			sampled[i] = true
		default:
			boundIOs += float64(delta.Ops)
			boundLatSumNs += float64(delta.TimeNs)
		}
		next.Disks[d.Spec.Name] = DiskState{Last: d.Counters, Set: prev.Set, Applied: prev.Applied}
	}
	for name := range st.Disks {
		if _, ok := next.Disks[name]; !ok {
			out.Gone = append(out.Gone, name)
		}
	}
	slices.Sort(out.Gone)

	// The host's window (PARDA, with every host's record) and its budget.
	// Latencies are normalised for I/O size by parda's model, as the
	// gateway's are.
	var meanBytes float64
	switch p := in.Probe; {
	case p != nil:
		// The host's I/O at the latency its probes saw: the weight of
		// its record is its I/O, its latency the datastore's.
		ios, latSumNs, next.LatNs = 0, 0, 0
		if p.N > 0 {
			next.LatNs = p.LatSumNs / float64(p.N)
			for _, r := range out.Disks {
				ios += r.IOPS * periodS
			}
			latSumNs, meanBytes = ios*next.LatNs, ProbeBytes
		}
	case ios == 0 && boundIOs > 0 && ctl != nil && boundLatSumNs/boundIOs < ctl.Config().ThresholdNs:
		// Every disk with I/O was held by its throttle: their latency is
		// an upper bound of the device's. Below the threshold it still
		// says the datastore is not congested, and lets the window grow.
		ios, latSumNs = boundIOs, boundLatSumNs
		for i, r := range out.Disks {
			sampled[i] = r.LatencyNs > 0 && !r.Reset
		}
		fallthrough
	default:
		if ios > 0 {
			var bytes float64
			for i, r := range out.Disks {
				if sampled[i] {
					bytes += r.Bytes * periodS
				}
			}
			meanBytes = bytes / ios
			next.LatNs = latSumNs / ios
		}
	}
	normSum := parda.DefaultSizeModel.Normalize(latSumNs, meanBytes)
	// Did the host use its window (parda's Hold lets only a used window
	// grow)? Its I/O came to at least boundFraction of its last budget
	// (the window at the threshold): then the window was used, whatever
	// the latency; else what it kept outstanding (Little's law).
	peak := 0
	var iops float64
	for _, r := range out.Disks {
		iops += r.IOPS
	}
	switch {
	case ctl != nil && st.Window > 0 && iops >= boundFraction*st.Window/(ctl.Config().ThresholdNs/1e9):
		peak = int(math.Ceil(st.Window))
	case next.LatNs > 0:
		peak = int(math.Ceil(iops * next.LatNs / 1e9))
	}
	if ctl != nil && st.Window > 0 {
		// A rate, unlike a window, does not bound what waits at the
		// datastore: above its capacity the queue grows by the excess
		// every second, and below it the latency is the bare service
		// time. PARDA's steps (up to ×2 a period) then overshoot and
		// the budget went round a cycle of about 6 periods between 83
		// and 600 IOPS per host in the live test; the throttle driver
		// bounds the latency term's step (the share term still moves
		// the windows to the ratio of the hosts' shares).
		ctl = ctl.WithSteps(minStep, maxStep)
	}
	ps := parda.Step(ctl, parda.StepInput{Host: in.Host, EndNs: in.EndNs, PeriodNs: in.PeriodNs, IOs: uint64(ios),
		NormLatSumNs: normSum, ActiveShares: activeShares, Window: next.Window, Peak: peak, Recs: in.Recs})
	out.Publish, out.View = ps.Publish, ps.View
	out.BudgetIOPS = alloc.Inf
	out.HostLatNs = next.LatNs
	if ctl != nil {
		// The window in IOPS at the latency PARDA steers the datastore
		// to (Little's law at its fixed point). Converted with the
		// period's own latency instead, the budget swung from 10 to 260
		// IOPS in alternate periods in the live test (a period of high
		// latency starved the disks, the next one's low latency flooded
		// the array): PARDA already answers latency through the window.
		next.Window = ps.Window
		out.BudgetIOPS = next.Window / (ctl.Config().ThresholdNs / 1e9)
		next.Capacity = st.Capacity.Observe(ps.View, ctl.Config().ThresholdNs, in.EndNs)
	}

	// Entitle: the storage derivation within the budget. A disk's
	// throttle is the larger of its entitlement with the measured demands
	// (the budget the quiet disks leave is used) and its entitlement were
	// every disk to want more (a quiet disk may climb to its share at
	// once, as under mClock).
	withDemand, allWant := entitle.StorageRoot(""), entitle.StorageRoot("")
	for i, d := range in.Disks {
		r := &out.Disks[i]
		r.DemandIOPS = alloc.Inf
		if !r.Bound {
			r.DemandIOPS = r.IOPS
		}
		withDemand.Children = append(withDemand.Children, entitle.DiskNode(d.Spec, r.DemandIOPS))
		allWant.Children = append(allWant.Children, entitle.DiskNode(d.Spec, alloc.Inf))
	}
	alloc.Compute(withDemand, out.BudgetIOPS)
	alloc.Compute(allWant, out.BudgetIOPS)
	for i, d := range in.Disks {
		r := &out.Disks[i]
		a, b := withDemand.Children[i], allWant.Children[i]
		r.Entitlement, r.Why = a.Alloc, a.Reason.String()
		iops := math.Max(a.Alloc, b.Alloc)
		if b.Alloc > a.Alloc {
			r.Why = fmt.Sprintf("%s if it wants more (it uses %.0f)", b.Reason, a.Alloc)
		}
		if math.IsInf(iops, 1) {
			r.Why = "no limit and no SIOC budget"
		}
		r.Throttle = LimitsFor(iops)
		ds := next.Disks[d.Spec.Name]
		if r.Throttle == (Limits{}) && ds.Set == (Limits{}) {
			// Nothing to hold and nothing sluice set: the disk keeps
			// whatever throttle its domain has.
			ds.Applied = true
			next.Disks[d.Spec.Name] = ds
			continue
		}
		if !ds.Applied || changed(ds.Set, r.Throttle) {
			r.Change = true
			ds.Set, ds.Applied = r.Throttle, true
			next.Disks[d.Spec.Name] = ds
		}
	}
	out.State = next
	return out
}

// LimitsFor is the QEMU throttle of iops units per second (alloc.Inf or
// NaN: none), with QEMU's own bucket (no burst rate: a tenth of a
// second's I/O). Setting a throttle empties QEMU's bucket, so a disk may
// do a bucket of I/O at once after every change: with a bucket of one
// period each change let a limited disk exceed its limit by a period's
// I/O (10% in a 10 s window for each change, seen live); a tenth of a
// second bounds it to 1%.
func LimitsFor(iops float64) Limits {
	if math.IsInf(iops, 1) || math.IsNaN(iops) {
		return Limits{}
	}
	n := int64(math.Max(math.Ceil(iops), 1)) // 0 would mean unlimited
	return Limits{IOPS: n, BytesPerS: n * UnitBytes, SizeIOPS: UnitBytes}
}

// changed reports whether the throttle moved enough to be set again.
func changed(old, nu Limits) bool {
	if (old.IOPS == 0) != (nu.IOPS == 0) || old.MaxLengthS != nu.MaxLengthS {
		return true
	}
	d := math.Abs(float64(nu.IOPS - old.IOPS))
	return d > 1 && d > changeFraction*float64(old.IOPS)
}
