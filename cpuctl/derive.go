// Package cpuctl enforces and measures the CPU entitlements of VMs through
// Linux cgroups (DESIGN.md §2, issue 17). It has three parts:
//
//   - Derive (derive.go) is pure: from a host's CPU and its running VMs'
//     CPU reservation, shares and limit it computes each VM's cgroup
//     settings. It reads no file and no clock.
//   - Cgroups (cgroups.go) applies settings by reconciling: it reads each
//     file, writes only what differs, and so applying twice writes nothing.
//     V1 and V2 are the kernel's two hierarchies; Fake is a stateful
//     stand-in that renders itself as text for the agent's unit tests.
//   - Stats and Rates (measure.go) read what a VM's cgroup used: CPU time,
//     throttled time, and a ready-time analog (run-queue wait from
//     /proc/PID/schedstat, and PSI where the kernel has it).
//
// The package never decides which VMs run where: the caller passes the VMs
// of one host and the cgroup of each.
package cpuctl

import (
	"math"
	"strconv"

	"sluice/alloc"
	"sluice/policy"
)

// Inf is unbounded demand (alloc.Inf).
var Inf = alloc.Inf

// Ranges of the kernel's CPU weights.
const (
	MinWeight = 1     // cpu.weight (v2)
	MaxWeight = 10000 // cpu.weight (v2); a VM entitled to the whole host gets it
	MinShares = 2     // cpu.shares (v1)
	MaxShares = 262144
	// SharesScale is cpu.shares of a VM entitled to the whole host: the v2
	// scale times 1024/100, the usual weight↔shares mapping (systemd's), so
	// that v1 and v2 give the same ratios.
	SharesScale = MaxWeight * 1024 / 100
	// DefaultPeriodUs is the CFS bandwidth period the limits use (the
	// kernel's default, 100 ms).
	DefaultPeriodUs = 100_000
	// MinQuotaUs is the smallest quota the kernel accepts (1 ms).
	MinQuotaUs = 1000
)

// HostCPU is what the VMs of a host share: Cores cores of MHz each. When
// the VMs are confined to fewer CPUs (a cpuset), Cores is those CPUs.
type HostCPU struct {
	Cores int
	MHz   int // per core
	// HostCores are the first cores, kept for the host itself: never
	// pinned to a latency-sensitive VM (Pin).
	HostCores int
}

// CapacityMHz is Cores × MHz.
func (h HostCPU) CapacityMHz() float64 { return float64(h.Cores) * float64(h.MHz) }

// VM is one running VM's CPU settings, as the policy states them
// (policy.VMCPU), and its demand.
type VM struct {
	Name           string
	VCPUs          int     // ≥ 1; the VM can use at most VCPUs cores
	Shares         int     // total for the VM
	ReservationMHz int     // 0: none
	LimitMHz       int     // 0: unlimited
	DemandMHz      float64 // alloc.Inf when unknown (full contention)
	// Sensitive marks a latency-sensitive VM: Pin gives each of its
	// vCPUs a core of its own, and it has no limit.
	Sensitive bool
}

// FromPolicy is the VM of a policy VM with unbounded demand. A
// latency-sensitive VM has no limit (validation refuses one).
func FromPolicy(v *policy.VM) VM {
	vm := VM{Name: v.Name, VCPUs: v.CPU.VCPUs, Shares: v.CPU.Shares,
		ReservationMHz: v.CPU.ReservationMHz, LimitMHz: v.CPU.LimitMHz, DemandMHz: alloc.Inf, Sensitive: v.LatencySensitive}
	if vm.Sensitive {
		vm.LimitMHz = 0
	}
	return vm
}

// HostFromPolicy is the CPU of a policy host.
func HostFromPolicy(h *policy.Host) HostCPU {
	return HostCPU{Cores: h.CPU.Cores, MHz: h.CPU.MHz, HostCores: h.CPU.HostCores}
}

// Setting is the desired cgroup state of one VM.
type Setting struct {
	VM string
	// EntitlementMHz is the VM's floor entitlement (alloc.Floor) over the
	// host's MHz; Reason says what bound it.
	EntitlementMHz float64
	Reason         alloc.Reason
	Weight         int   // cpu.weight (v2), MinWeight..MaxWeight
	Shares         int   // cpu.shares (v1), MinShares..MaxShares
	QuotaUs        int64 // cpu.max quota / cpu.cfs_quota_us per PeriodUs; -1: no limit
	PeriodUs       int64
	// Cores are the cores of its own a latency-sensitive VM's vCPUs are
	// pinned to (Pin), vCPU i on Cores[i]; nil for a VM not pinned. A
	// pinned VM is entitled to those cores whole (EntitlementMHz = their
	// MHz) and has no quota.
	Cores []int
}

// ReasonString is what bound the entitlement: "pinned" for a VM on cores
// of its own, else alloc's reason.
func (s Setting) ReasonString() string {
	if s.Cores != nil {
		return "pinned"
	}
	return s.Reason.String()
}

// CPUMax renders the v2 cpu.max value: "QUOTA PERIOD" or "max PERIOD".
func (s Setting) CPUMax() string {
	q := "max"
	if s.QuotaUs >= 0 {
		q = strconv.FormatInt(s.QuotaUs, 10)
	}
	return q + " " + strconv.FormatInt(s.PeriodUs, 10)
}

// Derive computes the cgroup settings of the VMs of one host, in the order
// given. The rules:
//
//   - Entitlements are alloc's floor semantics (as mClock and the storage
//     side): each VM gets max(R, its share of the host's MHz), capped by
//     its limit, its vCPUs × MHz and its demand. A reservation is a floor,
//     not a head start: ESX's CPU scheduler, from which mClock's R/S/L come,
//     treats it so, and additive semantics would give a reserving VM its
//     reservation and then its full share again.
//
//   - Weights are proportional to the entitlements, scaled so that the
//     whole host is MaxWeight (v2) or SharesScale (v1). The entitlements
//     add up to at most the capacity, so when every VM is busy a VM's
//     weight fraction is at least its entitlement over the capacity, hence
//     at least its reservation fraction; when some are idle the busy ones
//     only gain. Rounding costs at most one weight unit per VM.
//
//   - A limit becomes a CFS quota: LimitMHz / MHz cores per period, at
//     least MinQuotaUs.
//
//   - Latency-sensitive VMs are pinned (Pin): each is entitled to its
//     cores whole, with no limit, and the others divide the MHz of the
//     cores left (Cores − pinned) by the rules above. A sensitive VM that
//     found no cores is divided with the others.
//
// Demand lets the caller recompute each step from measured use, as the
// network's dynamic mode does for HTB: the weight of an idle VM without a
// reservation goes to the busy ones. A VM's demand counts as at least its
// reservation, so a reservation holds the moment an idle VM wakes. With
// unbounded demand the weights are those of full contention, which
// already guarantee reservations. CFS is work-conserving whatever the
// weights: they only matter when VMs contend.
func Derive(h HostCPU, vms []VM) []Setting {
	root := &alloc.Node{Name: "host", Limit: alloc.Inf, Demand: alloc.Inf, Semantics: alloc.Floor}
	capMHz := h.CapacityMHz()
	pin := Pin(h, vms)
	shared := capMHz - float64(pin.PinnedCount())*float64(h.MHz)
	for _, v := range vms {
		if v.Sensitive {
			v.LimitMHz = 0
		}
		lim := alloc.Inf
		if v.LimitMHz > 0 {
			lim = float64(v.LimitMHz)
		}
		if v.VCPUs > 0 && h.MHz > 0 {
			lim = min(lim, float64(v.VCPUs)*float64(h.MHz))
		}
		d := v.DemandMHz
		if d < 0 || math.IsNaN(d) {
			d = alloc.Inf
		}
		// A reservation is kept in the weights while the VM is idle: it
		// must hold the moment the VM wakes, before the next step.
		d = max(d, float64(v.ReservationMHz))
		root.Children = append(root.Children, &alloc.Node{Name: v.Name, Reservation: float64(v.ReservationMHz),
			Shares: float64(v.Shares), Limit: lim, Demand: d})
	}
	// The pinned VMs take no part in the division: their nodes get
	// nothing of it and are replaced below.
	for i, v := range vms {
		if pin.VMs[v.Name] != nil {
			root.Children[i].Demand, root.Children[i].Reservation = 0, 0
		}
	}
	alloc.Compute(root, shared)
	out := make([]Setting, len(vms))
	for i, v := range vms {
		n := root.Children[i]
		ent, reason := n.Alloc, n.Reason
		cores := pin.VMs[v.Name]
		if cores != nil {
			ent, reason = float64(len(cores))*float64(h.MHz), alloc.ReservationBound
			v.LimitMHz = 0
		}
		frac := 0.0
		if capMHz > 0 {
			frac = ent / capMHz
		}
		s := Setting{VM: v.Name, EntitlementMHz: ent, Reason: reason, Cores: cores,
			Weight:   clampInt(math.Round(frac*MaxWeight), MinWeight, MaxWeight),
			Shares:   clampInt(math.Round(frac*SharesScale), MinShares, MaxShares),
			QuotaUs:  -1,
			PeriodUs: DefaultPeriodUs}
		if v.LimitMHz > 0 && !v.Sensitive && h.MHz > 0 {
			// Integer ceiling: in floating point 1430/2600 × 100000 is
			// 55000.000000000007 and would round up to 55001.
			q := (int64(v.LimitMHz)*DefaultPeriodUs + int64(h.MHz) - 1) / int64(h.MHz)
			s.QuotaUs = max(q, MinQuotaUs)
		}
		out[i] = s
	}
	return out
}

func clampInt(v float64, lo, hi int) int {
	return int(min(max(v, float64(lo)), float64(hi)))
}
