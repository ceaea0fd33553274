// Package placement decides where VMs run so that every reservation can be
// met: admission control (refuse a VM whose CPU, memory, network or IOPS
// reservations fit on no host, naming the shortfall on each host), initial
// placement (the fitting host that leaves the cluster most balanced), fault
// repair (the fewest, cheapest migrations that restore every reservation
// after a reconfiguration or a lost uplink) and rebalancing (a DRS-like
// pass with a migration threshold, a cost–benefit filter, a cap on moves
// and no oscillation). See docs/placement.md.
//
// Whether a VM fits a host, and why not, is package feasible's to say (the
// checks that policy validation and the libvirt hook apply too), and a
// host's vNICs are packed onto its uplinks by feasible's packer, the one
// the derivation of the uplink trees uses; placement keeps per-host loads
// and chooses among the hosts that fit.
//
// placement is pure: it never imports time, net, os or os/exec, and it
// keeps no state between calls. It does not carry out migrations: Plan
// returns decisions, and the simulator or the controller applies them. Time,
// where it matters (the cooldown after a migration), is an argument in
// nanoseconds.
package placement

import (
	"math"
	"slices"

	"sluice/policy"
)

// Placement maps a VM's name to the name of its host. A VM that is absent
// or maps to "" is not running (a power-on request when given to Plan).
type Placement map[string]string

// Demand is the recent demand that rebalancing weighs. Missing entries mean
// "no measurement": a VM's CPU entitlement is then its reservation, its
// memory entitlement its configured size, a vNIC's its reservation.
type Demand struct {
	CPUMHz      map[string]float64 // VM → MHz in use
	MemoryBytes map[string]float64 // VM → bytes in use (active memory)
	NetBps      map[string]float64 // port "VM/NIC" → bits/s sent
}

// Options steer one placement pass.
type Options struct {
	// Threshold is the migration threshold, 1 (conservative: repair faults
	// only, never move to balance) … 5 (aggressive). 0 means 3.
	Threshold int
	// MaxMoves caps the rebalancing migrations of one pass (repairs are
	// mandatory and not capped). 0 means 8; negative means none.
	MaxMoves int
	// IntervalS is the time in seconds until the next pass: the time a
	// move's gain is held against its cost. 0 means 300 (DRS's 5 minutes).
	IntervalS float64
	// VMotionBps is the bandwidth a migration copies memory at. 0 means the
	// vmotion class limit, else the smaller usable rate of the two hosts'
	// first uplinks.
	VMotionBps float64
	// DemandMargin is the relative error of a demand measurement that a
	// rebalancing move's gain must survive: the gain is also computed with
	// the VM loading its destination 1+DemandMargin times what it loaded
	// its source. 0 means 0.1; negative means none.
	DemandMargin float64
	// NetworkWeight is the weight of the network term in the imbalance
	// metric (0: balance CPU and memory only, as DRS does).
	NetworkWeight float64
	// Changed names VMs whose settings just changed. When repairs are
	// otherwise equal, the changed VM is the one moved (DRS moves the VM
	// whose new reservation cannot be met, seed 000 Fig. 2).
	Changed []string
	// DownUplinks names lost uplinks, "HOST/UPLINK"; they carry nothing.
	DownUplinks []string
	// NowNs (the caller's clock, nanoseconds) and History (each VM's last
	// migration) keep rebalancing from undoing itself: a VM that migrated
	// less than CooldownNs ago (0 means 15 minutes) does not move, and a VM
	// does not move back to the host it last left for ReturnNs (0 means 1
	// hour). Repairs ignore both. Result.Record keeps History current.
	NowNs      int64
	History    map[string]LastMove
	CooldownNs int64
	ReturnNs   int64
}

// LastMove is a VM's last migration: when, from which host, to which.
type LastMove struct {
	AtNs     int64
	From, To string
}

// Record notes the migrations of r, taken at nowNs, in history.
func (r Result) Record(history map[string]LastMove, nowNs int64) {
	for _, d := range r.Decisions {
		if d.IsMove() {
			history[d.VM] = LastMove{AtNs: nowNs, From: d.From, To: d.To}
		}
	}
}

// Kind is the kind of a Decision.
type Kind uint8

const (
	// Admit: a VM without a host is powered on on To.
	Admit Kind = iota
	// Refuse: a VM's reservations fit on no host; it stays off.
	Refuse
	// Repair: a migration that restores the reservations of a broken host.
	Repair
	// Rebalance: a migration that improves the balance enough to pay for itself.
	Rebalance
	// NoRepair: a broken host that no set of migrations found can mend.
	NoRepair
	// Fault: a host (or cluster-wide quota) whose reservations are not met
	// before the pass; Repair or NoRepair decisions follow.
	Fault
)

var kindNames = [...]string{Admit: "admit", Refuse: "refuse", Repair: "move", Rebalance: "move", NoRepair: "no-repair", Fault: "fault"}

// String returns the word the decision is printed with.
func (k Kind) String() string { return kindNames[k] }

// Decision is one thing placement decided, with the reason.
type Decision struct {
	Kind Kind
	// VM is the VM concerned ("" for host faults); From and To are hosts
	// ("" when not relevant).
	VM, From, To string
	// Host is the broken host of a Fault or NoRepair decision.
	Host string
	// Why is the reason, one line.
	Why string
	// Details are per-host shortfalls (Refuse) or per-resource problems
	// (Fault, NoRepair), one line each.
	Details []string
	// CostS is a migration's estimated time in seconds (memory / vMotion
	// bandwidth); Gain is the imbalance a Rebalance move removes.
	CostS, Gain float64
}

// IsMove reports whether the decision is a migration.
func (d Decision) IsMove() bool { return d.Kind == Repair || d.Kind == Rebalance }

// Result is what one Plan pass decided.
type Result struct {
	// Decisions in the order they were taken: faults, repairs, admissions
	// and refusals, rebalancing moves.
	Decisions []Decision
	// Placement is the placement after every decision (refused VMs absent).
	Placement Placement
	// DownUplinks are the lost uplinks the pass took into account,
	// "HOST/UPLINK" (Options.DownUplinks).
	DownUplinks []string
	// ImbalanceBefore and ImbalanceAfter are the metric before and after.
	ImbalanceBefore, ImbalanceAfter float64
	// Threshold is the threshold that was applied (1..5); Target the
	// imbalance it tolerates.
	Threshold int
	Target    float64
	// OK is true when, after the pass, every running VM's reservations are
	// met and no power-on was refused.
	OK bool
}

// Moves returns the migrations of r, repairs first, in order.
func (r Result) Moves() []Decision {
	var ms []Decision
	for _, d := range r.Decisions {
		if d.IsMove() {
			ms = append(ms, d)
		}
	}
	return ms
}

// thresholds gives, per migration threshold 1..5, the imbalance the pass
// tolerates and the least gain a rebalancing move must bring, per host: a
// move of one VM changes the standard deviation over n hosts by about
// 1/n of what it would over one, so the least gain is minGain/n. (With two
// hosts, threshold 3 asks a move for 0.02.) Threshold 1 never rebalances.
var thresholds = [6]struct{ target, minGain float64 }{
	1: {math.Inf(1), math.Inf(1)},
	2: {0.20, 0.10},
	3: {0.10, 0.04},
	4: {0.05, 0.02},
	5: {0.02, 0.01},
}

// Plan runs one placement pass over the cluster p with the placement cur
// (nil: the hosts p gives; VMs without a host are power-on requests) and
// the recent demand d: it finds faults and repairs them, admits or refuses
// VMs without a host, then rebalances. p is not modified.
func Plan(p *policy.Policy, cur Placement, d Demand, o Options) Result {
	o = o.withDefaults()
	s := newState(p, cur, d, &o)
	var r Result
	r.Threshold = o.Threshold
	r.DownUplinks = o.DownUplinks
	r.Target = thresholds[o.Threshold].target
	r.ImbalanceBefore = s.bal.imbalance()

	r.Decisions = append(r.Decisions, s.clusterFaults()...)
	r.Decisions = append(r.Decisions, s.repairAll(&o)...)
	r.Decisions = append(r.Decisions, s.admitAll(cur)...)
	r.Decisions = append(r.Decisions, s.rebalance(&o)...)
	r.Decisions = s.retryRefused(r.Decisions)

	r.ImbalanceAfter = s.bal.imbalance()
	r.Placement = Placement{}
	r.OK = true
	for vi := range s.vms {
		v := &s.vms[vi]
		if v.host < 0 {
			continue
		}
		h := &s.hosts[v.host]
		r.Placement[v.name] = h.name
	}
	for hi := range s.hosts {
		if !s.hostOK(hi) {
			r.OK = false
		}
	}
	for _, dc := range r.Decisions {
		if dc.Kind == Refuse || (dc.Kind == Fault && dc.Host == "") {
			r.OK = false
		}
	}
	return r
}

func (o Options) withDefaults() Options {
	if o.Threshold < 1 || o.Threshold > 5 {
		o.Threshold = 3
	}
	if o.MaxMoves == 0 {
		o.MaxMoves = 8
	}
	if o.DemandMargin == 0 {
		o.DemandMargin = 0.1
	} else if o.DemandMargin < 0 {
		o.DemandMargin = 0
	}
	if o.IntervalS <= 0 {
		o.IntervalS = 300
	}
	if o.CooldownNs <= 0 {
		o.CooldownNs = 15 * 60 * 1e9
	}
	if o.ReturnNs <= 0 {
		o.ReturnNs = 60 * 60 * 1e9
	}
	return o
}

// Check reports the faults of placement cur on p without changing
// anything: hosts whose VMs' reservations are not met, and cluster-wide
// quotas (network pools, datastore IOPS) that are exceeded.
func Check(p *policy.Policy, cur Placement, o Options) []Decision {
	o = o.withDefaults()
	s := newState(p, cur, Demand{}, &o)
	ds := s.clusterFaults()
	for hi := range s.hosts {
		if !s.hostOK(hi) {
			ds = append(ds, s.faultOf(hi))
		}
	}
	return ds
}

// CheckHosts is Check restricted to the hosts named in hosts (names that
// are no host of p are ignored): every cluster-wide fault, and the faults
// of those hosts, the same decisions in the same order as Check gives
// them. It compiles only the VMs placed on those hosts, so that checking
// the hosts a change can touch (Change.Hosts) costs a pass over the VMs,
// not a placement state of the cluster.
func CheckHosts(p *policy.Policy, cur Placement, o Options, hosts []string) []Decision {
	o = o.withDefaults()
	scope := make([]bool, len(p.Hosts))
	for i := range p.Hosts {
		scope[i] = slices.Contains(hosts, p.Hosts[i].Name)
	}
	s := newScopedState(p, cur, &o, scope)
	ds := s.clusterFaults()
	for hi := range s.hosts {
		if scope[hi] && !s.hostOK(hi) {
			ds = append(ds, s.faultOf(hi))
		}
	}
	return ds
}
