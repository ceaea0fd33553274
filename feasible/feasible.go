// Package feasible is sluice's one answer to "does this VM fit this host"
// (DESIGN.md §2, admission rules): a list of checks, each saying whether
// it holds and, when it does not, why, in one line that names the
// resource, what is needed, what is free and the shortfall. It also holds
// the cluster-wide quotas (network pools, datastore IOPS), the rules on
// traffic-class reservations and pool quotas that no VM decides, and the
// one packer that assigns vNICs to uplinks.
//
// Policy validation (policy.Admission), placement (fits, refusals,
// faults), the libvirt hook's admission (through placement) and the
// derivation of the uplink trees (policy.AssignUplinks, used by
// entitle.Derive) all call this package, so they cannot disagree: a rule
// is written once, with its reason at hand (Nomad's FeasibilityChecker).
//
// It sits below policy in the dependency graph (policy validates files
// with it, and placement, admit and entitle import policy), so it imports
// no sluice package: callers fill in plain quantities — bits/s, MHz,
// bytes, IOPS, as int64 — from their own models. It is pure: it never
// imports time, net, os or os/exec, and keeps no state between calls
// other than what a caller's Load caches.
//
// A capacity of 0 means "not modelled" (docs/policy.md): a host without
// cores constrains neither vCPUs nor CPU reservations, one without a
// clock rate no CPU reservation, one without memory no memory. Uplinks are
// always modelled: a host without uplinks has no room for a vNIC
// reservation.
package feasible

import "sort"

// Host is what a host offers VMs.
type Host struct {
	Name string
	// Cores is the number of physical cores; 0: CPU not modelled (no
	// vCPU or CPU reservation check).
	Cores int
	// CoreMHz is the clock rate of one core; 0: CPU reservations not
	// modelled.
	CoreMHz int64
	// HostCores are the cores kept for the host itself, never pinned to
	// a latency-sensitive VM (policy cpu.hostCores); the others, Cores −
	// HostCores, are what such VMs may pin.
	HostCores int
	// MemoryBytes is the host's memory; 0: memory not modelled.
	MemoryBytes int64
	// Uplinks are the host's uplinks in file order, with the budget
	// vNIC reservations may take on each (Classes.Budget).
	Uplinks []Uplink
}

// CPUMHz is the host's CPU capacity, cores × MHz per core, or 0 when it
// is not modelled.
func (h *Host) CPUMHz() int64 { return int64(h.Cores) * h.CoreMHz }

// Uplink is one uplink of a host as vNIC reservations see it.
type Uplink struct {
	Name string
	// BudgetBps is what the reservations of the vNICs on the uplink may
	// add up to, bits/s (Classes.Budget).
	BudgetBps int64
	// Why says where the budget comes from, for reasons, e.g.
	// "reservationCap 0.75 × 10Gbps" (Classes.BudgetWhy).
	Why string
	// Down marks a lost uplink: it takes no vNIC.
	Down bool
	// InBudgetBps is what the inbound reservations of the vNICs that
	// receive through the uplink may add up to, bits/s: the same rule as
	// BudgetBps on the classes' inbound reservations, a budget of its own
	// (Classes.Budget of the inbound Classes). InWhy says where it comes
	// from.
	InBudgetBps int64
	InWhy       string
}

// VM is what a VM asks of a host.
type VM struct {
	Name        string
	VCPUs       int
	CPUMHz      int64 // CPU reservation
	MemoryBytes int64
	// Pinned marks a latency-sensitive VM: on a host whose cores are
	// modelled each of its vCPUs takes a core of its own (cpuCoresCheck),
	// and those whole cores are what it reserves of the host's MHz
	// (ReservedMHz).
	Pinned bool
	// NICs are the vNICs that reserve bandwidth (sending or receiving) or
	// are pinned to an uplink (others ask nothing of a host), sorted with
	// SortNICs.
	NICs []NIC
}

// PinsOn reports whether v takes cores of its own on h: it is
// latency-sensitive and h's cores are modelled.
func (v *VM) PinsOn(h *Host) bool { return v.Pinned && h.Cores > 0 }

// ReservedMHz is what v reserves of h's CPU: its reservation, or, when it
// takes cores of its own there, those cores whole (VCPUs × CoreMHz): the
// MHz left to the host's other VMs shrinks by them.
func (v *VM) ReservedMHz(h *Host) int64 {
	if v.PinsOn(h) {
		return int64(v.VCPUs) * h.CoreMHz
	}
	return v.CPUMHz
}

// NetBps is the sum of the VM's vNIC reservations, bits/s.
func (v *VM) NetBps() int64 {
	var sum int64
	for _, n := range v.NICs {
		sum = add(sum, n.ReservationBps)
	}
	return sum
}

// InBps is the sum of the VM's vNIC inbound reservations, bits/s.
func (v *VM) InBps() int64 {
	var sum int64
	for _, n := range v.NICs {
		sum = add(sum, n.InReservationBps)
	}
	return sum
}

// NIC is one vNIC as the packer sees it.
type NIC struct {
	Name           string // for reasons: the NIC's name, or its port VM/NIC
	ReservationBps int64
	// InReservationBps is the vNIC's inbound reservation. It does not
	// move the vNIC: a vNIC receives through the uplink it sends by.
	InReservationBps int64
	// Uplink is the uplink the vNIC is pinned to, or "".
	Uplink string
	// VM and Index place the vNIC in file order (the VM's position among
	// the cluster's VMs, the vNIC's among the VM's): the packing order
	// breaks ties by them, and Load.Remove finds a VM's vNICs by VM.
	VM, Index int
}

// Less is the packing order: vNICs pinned to an uplink first, then larger
// reservations first, then file order.
func Less(a, b *NIC) bool {
	if (a.Uplink != "") != (b.Uplink != "") {
		return a.Uplink != ""
	}
	if a.ReservationBps != b.ReservationBps {
		return a.ReservationBps > b.ReservationBps
	}
	if a.VM != b.VM {
		return a.VM < b.VM
	}
	return a.Index < b.Index
}

// SortNICs sorts nics into the packing order (Less).
func SortNICs(nics []NIC) {
	sort.Slice(nics, func(i, j int) bool { return Less(&nics[i], &nics[j]) })
}

// Reason is why a check does not hold.
type Reason struct {
	// Check is the name of the check (one of the Checks' names, or
	// "host" when the host cannot meet its own VMs' reservations).
	Check string
	// NIC names the vNIC concerned, when the reason is about one.
	NIC string
	// Text is the reason in one line, starting with the resource:
	// "cpu: needs 10000MHz reserved, free 8000MHz of 4 cores × 2000MHz
	// (short 2000MHz)".
	Text string
}

func (r Reason) String() string { return r.Text }

// A Check is one rule of "does this VM fit this host".
type Check interface {
	// Name names the check: "cpu.vcpus", "cpu.cores", "cpu.reservation", "memory",
	// "network.pin", "network" or "network.inbound".
	Name() string
	// Holds reports whether host h meets the rule with the VMs of load l.
	Holds(h *Host, l *Load) bool
	// Fit reports whether v fits on h beside the VMs of l (which it is
	// not among), and why not. It assumes the check holds for l.
	Fit(h *Host, l *Load, v *VM, s *Scratch) (bool, Reason)
	// Broken lists why h breaks the rule with the VMs of l (vms), one
	// line each; nil when it holds.
	Broken(h *Host, l *Load, vms []*VM) []string
}

// Checks is the list, in the order reasons are given.
var Checks = []Check{vcpuCheck{}, coresCheck{}, cpuCheck{}, memoryCheck{}, pinCheck{}, networkCheck{}, inboundCheck{}}

// Holds reports whether host h meets every check with the VMs of l.
func Holds(h *Host, l *Load) bool {
	for _, c := range Checks {
		if !c.Holds(h, l) {
			return false
		}
	}
	return true
}

// Fits reports whether v fits on h beside the VMs of l: h meets every
// check now, and still does with v. It changes nothing but s.
func Fits(h *Host, l *Load, v *VM, s *Scratch) bool {
	if !Holds(h, l) {
		return false
	}
	for _, c := range Checks {
		if ok, _ := c.Fit(h, l, v, s); !ok {
			return false
		}
	}
	return true
}

// Why lists why v does not fit on h beside the VMs of l, one reason per
// failing check (first: the host cannot meet its own VMs' reservations,
// when that is so; a vNIC that one check has given a reason for is not
// named again by a later one); nil when it fits.
func Why(h *Host, l *Load, v *VM, s *Scratch) []Reason {
	var out []Reason
	holds := Holds(h, l)
	if !holds {
		out = append(out, Reason{Check: "host", Text: "the host cannot meet its own VMs' reservations"})
	}
	named := ""
	for _, c := range Checks {
		if !holds && !c.Holds(h, l) {
			continue // the check cannot judge v on a host that breaks it
		}
		if ok, r := c.Fit(h, l, v, s); !ok && (r.NIC == "" || r.NIC != named) {
			out = append(out, r)
			if r.NIC != "" {
				named = r.NIC
			}
		}
	}
	return out
}

// Problems lists why h cannot meet the reservations of the VMs of l
// (vms), one line per problem; nil when it can.
func Problems(h *Host, l *Load, vms []*VM) []string {
	var out []string
	for _, c := range Checks {
		if !c.Holds(h, l) {
			out = append(out, c.Broken(h, l, vms)...)
		}
	}
	return out
}
