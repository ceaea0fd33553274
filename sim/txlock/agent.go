package txlock

import (
	"math"

	"sluice/alloc"
)

// Sample is one agent interval: what the link and each VM sent in it.
type Sample struct {
	AtNs      int64     // the interval's end
	RateBps   float64   // the link's wire rate
	VMRateBps []float64 // each VM's, in Config.VMs order
}

// agent is the live agent's dynamic enforcement (docs/agent.md, and
// agent/demand.go for the estimate): every interval it reads what each VM
// sent, estimates its demand (estimate), computes entitlements with
// alloc on the link's rate and sets them: HTB leaf rates (ceil = the limit,
// or the line; in mq-htb the queue's root), or the VMs' EDT rates. For its
// first second it keeps the rates it set at start, with every VM unbounded.
type agent struct {
	root   *alloc.Node
	solver alloc.Solver
	ticks  int
}

const histLen = 10 // intervals in the demand window (1 s at 100 ms)

func (a *agent) init(r *run) {
	a.root = &alloc.Node{Name: "uplink", Limit: math.Inf(1), Semantics: alloc.Additive}
	for _, v := range r.cfg.VMs {
		lim := v.LimitBps
		if lim <= 0 {
			lim = math.Inf(1)
		}
		a.root.Children = append(a.root.Children, &alloc.Node{
			Name: v.Name, Reservation: v.ReservationBps, Shares: v.Shares, Limit: lim,
			Demand: math.Inf(1), Semantics: alloc.Additive,
		})
	}
}

func (a *agent) tick(r *run) {
	a.ticks++
	iv := float64(r.cfg.IntervalNs) / 1e9
	s := Sample{AtNs: r.now, VMRateBps: make([]float64, len(r.vms))}
	for i := range r.vms {
		v := &r.vms[i]
		used := v.sentIv / iv
		v.sentIv = 0
		s.VMRateBps[i] = used
		s.RateBps += used
		v.hist = append(v.hist, histEntry{usedBps: used, rateBps: v.rateBps})
		if len(v.hist) > histLen {
			v.hist = v.hist[1:]
		}
	}
	r.samples = append(r.samples, s)
	if int64(a.ticks)*r.cfg.IntervalNs < 1_000_000_000 {
		return // the first demand window: measure only
	}
	demand := make([]float64, len(r.vms))
	for i := range r.vms {
		demand[i] = estimate(r.vms[i].hist, r.cfg.LinkBps)
	}
	a.set(r, demand)
}

// estimate is the agent's demand estimate (agent/demand.go): unbounded if
// in some interval of the last second the VM used ≥ 80% of its rate, else
// 1.5 × the most it used in the last second + 2% of the line.
func estimate(h []histEntry, lineBps float64) float64 {
	most := 0.0
	for _, e := range h {
		if e.usedBps >= 0.8*e.rateBps {
			return math.Inf(1)
		}
		most = math.Max(most, e.usedBps)
	}
	return 1.5*most + 0.02*lineBps
}

// set computes the entitlements for demand (nil: every VM unbounded) and
// sets the rates of the form.
func (a *agent) set(r *run, demand []float64) {
	for i, n := range a.root.Children {
		n.Demand = math.Inf(1)
		if demand != nil {
			n.Demand = demand[i]
		}
	}
	a.solver.Compute(a.root, r.cfg.LinkBps)
	floor := 1e-4 * r.cfg.LinkBps
	for _, q := range r.queues {
		q.rootBps = 0
	}
	for i, n := range a.root.Children {
		v := &r.vms[i]
		v.rateBps = math.Max(n.Alloc, floor)
		if v.queue >= 0 {
			r.queues[v.queue].rootBps += v.rateBps
		}
	}
	for i := range r.vms {
		v := &r.vms[i]
		ceil := r.cfg.LinkBps
		if r.cfg.Form == FormPerQueueHTB {
			ceil = r.queues[v.queue].rootBps
		}
		if v.LimitBps > 0 {
			ceil = math.Min(ceil, v.LimitBps)
		}
		v.ceilBps = math.Max(ceil, v.rateBps)
	}
}

func (r *run) tick() { r.agent.tick(r) }

// entitled is alloc's entitlement of each VM on capacity with its true
// demand at the window's end.
func entitled(cfg Config, capacity float64) []float64 {
	root := &alloc.Node{Name: "uplink", Limit: math.Inf(1), Semantics: alloc.Additive}
	end := cfg.DurationNs - 1
	for _, v := range cfg.VMs {
		lim := v.LimitBps
		if lim <= 0 {
			lim = math.Inf(1)
		}
		d := v.DemandBps
		if v.IdleToNs > v.IdleFromNs && end >= v.IdleFromNs && end < v.IdleToNs {
			d = 0
		}
		root.Children = append(root.Children, &alloc.Node{
			Name: v.Name, Reservation: v.ReservationBps, Shares: v.Shares, Limit: lim,
			Demand: d, Semantics: alloc.Additive,
		})
	}
	alloc.Compute(root, capacity)
	out := make([]float64, len(cfg.VMs))
	for i, n := range root.Children {
		out[i] = n.Alloc
	}
	return out
}

func (r *run) result() Result {
	cfg := r.cfg
	win := float64(cfg.DurationNs-cfg.WindowFromNs) / 1e9
	res := Result{Config: cfg, RateBps: r.linkBits / win, Pps: r.linkSkbs / win, Events: r.events, Samples: r.samples}
	ent := entitled(cfg, cfg.LinkBps)
	fair := entitled(cfg, res.RateBps)
	for i := range r.vms {
		v := &r.vms[i]
		res.VMs = append(res.VMs, VMResult{
			Name: v.Name, RateBps: v.sentWin / win, EntitledBps: ent[i], FairBps: fair[i], Queue: v.queue,
		})
	}
	for _, c := range r.cpus {
		res.CPUCores += c.busyNs / (win * 1e9)
		res.SpinCores += c.spinNs / (win * 1e9)
	}
	for _, l := range r.locks {
		res.LockBusy = math.Max(res.LockBusy, l.busyNs/(win*1e9))
	}
	return res
}
