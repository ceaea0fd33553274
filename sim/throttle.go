package sim

import (
	"math"

	"sluice/entitle"
	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
	"sluice/throttle"
)

// The throttle driver (package throttle, docs/throttle.md) on a datastore
// whose driver is "throttle": no host window and no mclock; each disk's
// I/O passes QEMU's throttle (qemuThrottle) and goes straight to the
// array. Every control period each host's agent runs throttle.Step, the
// function the live agent runs, with its disks' cumulative counters,
// every host's last published record of the datastore and its probes,
// and sets the throttles Step says to change.

// ThrottlePeriodNs is the throttle driver's control period: the agent's
// default (--storage-period 1s).
const ThrottlePeriodNs = Second

// throttleProbes is how many probe reads a host makes of each datastore
// in a period, one at a time (agent.ProbesPerPeriod).
const throttleProbes = 10

// throttleHost is the throttle driver of one host on one datastore: the
// agent's state and what it measures.
type throttleHost struct {
	s     *Sim
	name  string // HOST/DATASTORE
	host  string
	idx   int // index in ds.thosts (its record's slot)
	ds    *datastore
	disks []*diskState
	st    throttle.State
	last  throttle.Output
	// lastNs is the end of the last period; stepped says there was one.
	lastNs  int64
	stepped bool
	// probes of the current period; probeBusy: one is at the array,
	// probeDue: a tick came meanwhile (Go's ticker keeps one).
	probeN              int
	probeLatSumNs       float64
	probeBusy, probeDue bool
	// device latency of the disks' I/O in the current period (for the
	// datastore's latency series, as the gateway's hosts report it)
	io arrayIO
}

// throttleHost returns (making it) host's driver on ds.
func (s *Sim) throttleHost(ds *datastore, host string) *throttleHost {
	for _, h := range ds.thosts {
		if h.host == host {
			return h
		}
	}
	h := &throttleHost{s: s, name: host + "/" + ds.name, host: host, idx: len(ds.thosts), ds: ds}
	ds.thosts = append(ds.thosts, h)
	ds.recs = append(ds.recs, parda.Record{})
	s.rec.Gauge(prefQDepth+h.name, func() float64 { return h.st.Window })
	s.rec.Gauge(prefBudget+h.name, func() float64 { return finiteOr0(h.last.BudgetIOPS) })
	s.rec.Gauge(prefHostLat+h.name, func() float64 { return h.last.HostLatNs / 1e6 })
	s.rec.Gauge(prefPardaLat+h.name, func() float64 { return h.last.View.LatNs / 1e6 })
	return h
}

// addThrottleDisk makes disk spec a disk of its host's driver on ds.
func (s *Sim) addThrottleDisk(ds *datastore, spec entitle.DiskSpec) *diskState {
	h := s.throttleHost(ds, spec.Host)
	d := &diskState{name: spec.Name, th: h, spec: spec, iops: s.rec.Series(prefIOPS + spec.Name), lat: s.rec.Series(prefLat + spec.Name)}
	// params are the disk's R/S/L as the gateway's disks keep them, which
	// a set event changes (setDisk).
	d.params = mclock.Params{ReservationIOPS: spec.ReservationIOPS, Shares: max(spec.Shares, 1), LimitIOPS: spec.LimitIOPS}
	d.shares = d.params.Shares
	d.tq = &qemuThrottle{eng: s.eng, pass: ds.arrive}
	h.disks = append(h.disks, d)
	s.rec.Gauge(prefThrottle+spec.Name, func() float64 { return d.tq.iops })
	return d
}

func finiteOr0(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0
	}
	return v
}

// startThrottle schedules the periods of every host's driver, spread
// evenly over a period (the hosts' agents do not tick together), each
// host's probes ProbesPerPeriod times a period from its own start, and
// the datastore's latency series every period.
func (d *datastore) startThrottle() {
	n := int64(len(d.thosts))
	for i, h := range d.thosts {
		at := int64(i) * ThrottlePeriodNs / max(n, 1)
		d.s.eng.At(at, h.tick)
		d.s.eng.At(at+ThrottlePeriodNs/throttleProbes, h.probeTick)
	}
	d.s.eng.At(ThrottlePeriodNs, d.throttleLatency)
}

// controller is the datastore's PARDA controller: the policy's
// (policy.SIOC.Controller, as the gateway and the agent take it) at the
// current threshold, with the model's gains where the scenario calibrates
// them; nil when SIOC is off.
func (d *datastore) controller() *parda.Controller {
	if !d.sioc {
		return nil
	}
	if d.ctl == nil || d.ctl.Config().ThresholdNs != d.threshNs {
		cfg := d.siocPolicy.Controller().Config()
		cfg.ThresholdNs = d.threshNs
		if d.s.pardaCfg.Gamma != 0 {
			cfg.Gamma = d.s.pardaCfg.Gamma
		}
		if d.s.pardaCfg.BetaPerShare != 0 {
			cfg.BetaPerShare = d.s.pardaCfg.BetaPerShare
		}
		d.ctl = parda.New(cfg)
	}
	return d.ctl
}

// policyChanged is a change of the datastore's policy (SIOC on or off, a
// threshold, a disk's R/S/L): the agent ends its period at once
// (agent.Throttler.SetPolicy). The gateway takes it at its next period.
func (d *datastore) policyChanged() {
	for _, h := range d.thosts {
		h.step()
	}
}

// tick is the agent's period timer.
func (h *throttleHost) tick() {
	h.step()
	h.s.eng.After(ThrottlePeriodNs, h.tick)
}

// step runs one period of the driver (throttle.Step) and applies it: the
// throttles that change are set, the record is published.
func (h *throttleHost) step() {
	now := h.s.eng.NowNs()
	periodNs := now - h.lastNs
	if !h.stepped || periodNs <= 0 {
		periodNs = ThrottlePeriodNs // as the agent's first period
	}
	h.lastNs, h.stepped = now, true
	d := h.ds
	recs := make([]parda.Record, 0, len(d.recs))
	for _, r := range d.recs {
		if r.PeriodNs > 0 {
			recs = append(recs, r)
		}
	}
	in := throttle.Input{Host: h.host, EndNs: now, PeriodNs: periodNs, Recs: recs,
		Probe: &throttle.Probe{N: h.probeN, LatSumNs: h.probeLatSumNs}}
	h.probeN, h.probeLatSumNs = 0, 0
	for _, dk := range h.disks {
		in.Disks = append(in.Disks, throttle.Disk{Spec: dk.spec, Counters: dk.ctr})
	}
	out := throttle.Step(d.controller(), h.st, in)
	h.st, h.last = out.State, out
	d.recs[h.idx] = out.Publish
	for i, r := range out.Disks {
		if r.Change {
			h.disks[i].tq.set(float64(r.Throttle.IOPS))
		}
	}
}

// probeTick is the agent's probe timer: one 4 KiB read of the datastore
// in each tenth of a period, at a random time in it, one at a time; a
// probe due while one is out is kept for when it is back (a Go ticker's
// channel holds one tick).
func (h *throttleHost) probeTick() {
	slot := ThrottlePeriodNs / throttleProbes
	h.s.eng.After(h.s.eng.Rand.Int64N(slot), func() {
		if h.probeBusy {
			h.probeDue = true
		} else {
			h.probe()
		}
	})
	h.s.eng.After(slot, h.probeTick)
}

func (h *throttleHost) probe() {
	h.probeBusy = true
	t0 := h.s.eng.NowNs()
	q := &ioReq{bytes: throttle.ProbeBytes, t0Ns: t0}
	q.done = func() {
		h.probeN++
		h.probeLatSumNs += float64(h.s.eng.NowNs() - t0)
		h.probeBusy = false
		if h.probeDue {
			h.probeDue = false
			h.probe()
		}
	}
	h.ds.arrive(q)
}

// finishDirect completes an I/O of the throttle driver's datastore: a
// disk's (its counters as QEMU counts them: from the guest's request,
// the throttle's queue included, to the reply) or a probe's.
func (d *datastore) finishDirect(q *ioReq, now int64) {
	dk := q.disk
	if dk == nil {
		q.done()
		return
	}
	h := dk.th
	h.io.add(q, now)
	dk.ctr.Ops++
	dk.ctr.Bytes += uint64(q.bytes)
	dk.ctr.TimeNs += uint64(now - q.t0Ns)
	dk.complete(q, now)
}

// throttleLatency sets the datastore's latency series (dslat) from the
// disks' I/O of the last period, as the gateway's control period does
// from its hosts' reports: the size-normalised device latency (time at
// the array), below QEMU's throttles.
func (d *datastore) throttleLatency() {
	reports := make([]parda.HostReport, 0, len(d.thosts))
	for _, h := range d.thosts {
		reports = h.io.take(reports)
	}
	d.lastLatNs = d.size.DatastoreLatency(reports)
	d.s.eng.After(ThrottlePeriodNs, d.throttleLatency)
}

// datastoreDriver is the driver the simulator runs a datastore with: the
// run's (RunSpec.Driver), else the policy's. A datastore whose policy
// gives no driver is a gateway datastore in the simulator: its array is
// the emulated one `sluice datastore create` prepares (policy's
// DriverAt with the gateway's stats volume present).
func datastoreDriver(d *policy.Datastore, run string) string {
	if run != "" {
		return run
	}
	return d.DriverAt(true)
}
