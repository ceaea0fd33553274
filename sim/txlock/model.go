package txlock

import (
	"fmt"
	"math"
)

// Form is how the uplink's qdiscs are arranged.
type Form uint8

const (
	// FormSingleHTB is one HTB root for the whole uplink under one lock.
	FormSingleHTB Form = iota
	// FormPerQueueHTB is mq with one HTB per TX queue, a lock each.
	FormPerQueueHTB
	// FormEDTFQ is mq with fq per TX queue and per-VM departure stamps.
	FormEDTFQ
)

// Forms lists every form, in the order of the plan.
var Forms = []Form{FormSingleHTB, FormPerQueueHTB, FormEDTFQ}

// String returns the form's short name.
func (f Form) String() string {
	switch f {
	case FormSingleHTB:
		return "single-htb"
	case FormPerQueueHTB:
		return "mq-htb"
	case FormEDTFQ:
		return "mq-edt-fq"
	}
	return fmt.Sprintf("form(%d)", uint8(f))
}

// Costs are CPU costs per skb in nanoseconds. A cost is given for an
// MTU-sized skb (one segment) and grows linearly by the Seg field for every
// further segment of a GSO skb.
type Costs struct {
	// StackNs is the cost outside any qdisc lock (socket/tap, IP, driver).
	StackNs, StackSegNs float64
	// HTBNs is HTB's cost inside the qdisc lock: classify, enqueue, dequeue
	// and the lock's own operations.
	HTBNs, HTBSegNs float64
	// FQNs is fq's cost inside its queue's lock.
	FQNs, FQSegNs float64
	// ProgNs is the eBPF program at the vNIC or on clsact egress that picks
	// the queue (per-queue HTB) or stamps the departure time (EDT), outside
	// any lock; 0 in the single tree (its classifying program is common to
	// all forms and left out).
	ProgNs float64
	// HandoffNs is added to a lock's hold when it passes from one CPU to
	// another (the lock's and the qdisc's cache lines move).
	HandoffNs float64
	// Jitter is the relative spread of the cost outside the lock: each skb's
	// is drawn uniformly from StackNs×(1±Jitter). It breaks the CPUs'
	// lockstep.
	Jitter float64
}

// CalibratedCosts are the costs measured on the development machine (2
// vCPUs of an AMD EPYC KVM guest, Linux 6.18) by `bench/htb-lock.sh
// calibrate 2 5` on 2026-11-27 at 22:26 UTC (docs/perf/network.md "One HTB
// lock at 25–100 GbE"): a UDP send through an IFB sink, root qdisc noqueue
// vs an HTB shaped like sluice's tree, the sender's CPU time per skb,
// medians of 5 rounds. Stack: 2192 ns (MTU) and 4446 ns (64000-byte UDP
// GSO skb, 44 segments); HTB − noqueue: 586 ns (MTU; 573–651 over the
// rounds) and 568 ns (GSO; 498–696): HTB's cost does not grow with the
// skb. FQ*, ProgNs and Jitter are assumptions (this kernel has no fq);
// HandoffNs is fitted to the two-sender runs (HTB − noqueue grew by a
// median 50 ns for MTU, 161 ns for GSO skbs, spinning included).
var CalibratedCosts = Costs{
	StackNs:    2192,
	StackSegNs: 52, // (4446 − 2192) / 43
	HTBNs:      590,
	HTBSegNs:   0,
	FQNs:       590, // assumption: as HTB's (not measured: no fq here)
	FQSegNs:    0,   // assumption
	ProgNs:     100, // assumption
	HandoffNs:  60,
	Jitter:     0.2, // assumption
}

func (c Costs) stack(segs int) float64 { return c.StackNs + c.StackSegNs*float64(segs-1) }
func (c Costs) htb(segs int) float64   { return c.HTBNs + c.HTBSegNs*float64(segs-1) }
func (c Costs) fq(segs int) float64    { return c.FQNs + c.FQSegNs*float64(segs-1) }

// VM is one sender on the uplink.
type VM struct {
	Name string
	// ReservationBps, Shares and LimitBps are its network entitlement inputs
	// (wire bits/s; LimitBps 0 means none).
	ReservationBps, Shares, LimitBps float64
	// DemandBps is what it offers (skbs at exponential intervals); 0 or Inf
	// means it always has an skb ready (a backlogged TCP sender).
	DemandBps float64
	// Segs is the number of MTU-sized segments per skb: 1 without GSO/TSO,
	// 45 for a 64 KiB GSO skb.
	Segs int
	// IdleFromNs and IdleToNs, when IdleToNs > IdleFromNs, make the VM send
	// nothing in [IdleFromNs, IdleToNs).
	IdleFromNs, IdleToNs int64
}

// Config is one run.
type Config struct {
	Form    Form
	LinkBps float64 // the link's wire rate
	CPUs    int     // sending CPUs; every CPU sends for every VM
	Queues  int     // TX queues (default CPUs)
	VMs     []VM
	Costs   Costs
	// IntervalNs is the agent's interval (default 100 ms).
	IntervalNs int64
	// DurationNs is simulated time; the results cover [WindowFromNs, DurationNs).
	DurationNs, WindowFromNs int64
	// QueueCapBytes is the most a VM may have queued in the qdisc and on its
	// way there (default 2 MiB, an assumption: a guest's TCP window held in
	// the host's queues; at least one skb). It must cover a VM spread over
	// many queues: with EDT a VM's skbs wait in every CPU's queue.
	QueueCapBytes int64
	Seed          uint64
}

// Wire bytes: an MTU segment of 1500 bytes of IP plus Ethernet's header,
// FCS, preamble and gap.
const (
	segIPBytes   = 1500
	segWireBytes = segIPBytes + 14 + 4 + 8 + 12
)

// WireBits is the bits one skb of segs segments takes on the wire.
func WireBits(segs int) float64 { return float64(segs * segWireBytes * 8) }

// VMResult is one VM's outcome over the window.
type VMResult struct {
	Name string
	// RateBps is what it sent on the wire; EntitledBps what alloc gives it
	// on the link's rate with its true demand; FairBps what alloc gives it
	// on the rate the uplink achieved (the split alone, not the total).
	RateBps, EntitledBps, FairBps float64
	// Queue is the TX queue its skbs took (-1 for EDT: the sending CPU's).
	Queue int
}

// Result is one run's outcome.
type Result struct {
	Config Config
	// RateBps is the aggregate wire rate over the window; Pps its skbs/s.
	RateBps, Pps float64
	VMs          []VMResult
	// CPUCores is the CPU time of the sending path over the window (cores
	// busy on average: outside the lock, holding it and spinning);
	// SpinCores the part spent waiting for a lock; LockBusy the busiest
	// lock's occupancy (0..1).
	CPUCores, SpinCores, LockBusy float64
	// Samples are the agent's intervals over the whole run.
	Samples []Sample
	// Events counts the simulation's events (for the bench).
	Events uint64
}

// Gbps is the aggregate in Gbit/s.
func (r Result) Gbps() float64 { return r.RateBps / 1e9 }

// CPUPerGbps is the cores busy per Gbit/s sent (Inf when nothing was sent).
func (r Result) CPUPerGbps() float64 {
	if r.RateBps <= 0 {
		return math.Inf(1)
	}
	return r.CPUCores / r.Gbps()
}

// MaxError is the largest |rate − want| / want over the VMs that are due
// at least 1% of the link, with want their entitlement on the link (fair
// false) or on the achieved rate (fair true).
func (r Result) MaxError(fair bool) float64 {
	worst := 0.0
	for _, v := range r.VMs {
		want := v.EntitledBps
		if fair {
			want = v.FairBps
		}
		if want < 0.01*r.Config.LinkBps {
			continue
		}
		worst = math.Max(worst, math.Abs(v.RateBps-want)/want)
	}
	return worst
}

// LockBoundPps is the most skbs/s one lock can pass when every skb holds
// it for holdNs: 1e9/holdNs.
func LockBoundPps(holdNs float64) float64 { return 1e9 / holdNs }
