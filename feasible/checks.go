package feasible

import (
	"fmt"
	"strings"
)

// vcpuCheck: a VM has no more vCPUs than the host has cores.
type vcpuCheck struct{}

func (vcpuCheck) Name() string                { return "cpu.vcpus" }
func (vcpuCheck) Holds(h *Host, l *Load) bool { return l.Wide == 0 }

func (vcpuCheck) Fit(h *Host, l *Load, v *VM, _ *Scratch) (bool, Reason) {
	if !wide(h, v) {
		return true, Reason{}
	}
	return false, Reason{Check: "cpu.vcpus", Text: fmt.Sprintf("cpu: %d vCPUs > %d cores", v.VCPUs, h.Cores)}
}

func (vcpuCheck) Broken(h *Host, l *Load, vms []*VM) []string {
	var out []string
	for _, v := range vms {
		if wide(h, v) {
			out = append(out, fmt.Sprintf("cpu: %s has %d vCPUs, the host %d cores", v.Name, v.VCPUs, h.Cores))
		}
	}
	return out
}

// wide reports whether v has more vCPUs than h has cores (when h's CPU is
// modelled).
func wide(h *Host, v *VM) bool { return h.Cores > 0 && v.VCPUs > h.Cores }

// coresCheck: the latency-sensitive VMs of a host have a core of their
// own per vCPU among the cores it does not keep for itself.
type coresCheck struct{}

func (coresCheck) Name() string { return "cpu.cores" }

// pinnable is how many of h's cores latency-sensitive VMs may pin.
func pinnable(h *Host) int { return max(h.Cores-h.HostCores, 0) }

func (coresCheck) Holds(h *Host, l *Load) bool {
	return h.Cores == 0 || l.PinnedCores <= pinnable(h)
}

func (coresCheck) Fit(h *Host, l *Load, v *VM, _ *Scratch) (bool, Reason) {
	free := max(pinnable(h)-l.PinnedCores, 0)
	if !v.PinsOn(h) || v.VCPUs <= free {
		return true, Reason{}
	}
	return false, Reason{Check: "cpu.cores", Text: fmt.Sprintf("cpu: latency-sensitive %s needs %s of its own (one per vCPU), free %d of %s (%d kept for the host, %d pinned to latency-sensitive VMs; short %d)",
		v.Name, Cores(v.VCPUs), free, Cores(h.Cores), h.HostCores, l.PinnedCores, v.VCPUs-free)}
}

func (coresCheck) Broken(h *Host, l *Load, vms []*VM) []string {
	var names []string
	for _, v := range vms {
		if v.PinsOn(h) {
			names = append(names, fmt.Sprintf("%s %d", v.Name, v.VCPUs))
		}
	}
	return []string{fmt.Sprintf("cpu: latency-sensitive VMs need %s of their own (%s), the host has %d to give (%s − %d kept for the host; short %d)",
		Cores(l.PinnedCores), strings.Join(names, ", "), pinnable(h), Cores(h.Cores), h.HostCores, l.PinnedCores-pinnable(h))}
}

// Cores renders a number of cores: "1 core", "4 cores".
func Cores(n int) string {
	if n == 1 {
		return "1 core"
	}
	return fmt.Sprintf("%d cores", n)
}

// cpuCheck: the CPU reservations of a host's VMs fit its cores × MHz.
type cpuCheck struct{}

func (cpuCheck) Name() string { return "cpu.reservation" }

func (cpuCheck) Holds(h *Host, l *Load) bool {
	c := h.CPUMHz()
	return c == 0 || l.CPUMHz <= c
}

func (cpuCheck) Fit(h *Host, l *Load, v *VM, _ *Scratch) (bool, Reason) {
	c := h.CPUMHz()
	need := v.ReservedMHz(h)
	if c == 0 || need == 0 || add(l.CPUMHz, need) <= c {
		return true, Reason{}
	}
	free := max(c-l.CPUMHz, 0)
	what := ""
	if v.PinsOn(h) {
		what = fmt.Sprintf(" (latency-sensitive: %s of its own)", Cores(v.VCPUs))
	}
	return false, Reason{Check: "cpu.reservation", Text: fmt.Sprintf("cpu: needs %s reserved%s, free %s of %d cores × %s (short %s)",
		MHz(need), what, MHz(free), h.Cores, MHz(h.CoreMHz), MHz(need-free))}
}

func (cpuCheck) Broken(h *Host, l *Load, _ []*VM) []string {
	c := h.CPUMHz()
	return []string{fmt.Sprintf("cpu: reservations %s > capacity %s (%d cores × %s; short %s)",
		MHz(l.CPUMHz), MHz(c), h.Cores, MHz(h.CoreMHz), MHz(l.CPUMHz-c))}
}

// memoryCheck: the memory of a host's VMs fits the host's.
type memoryCheck struct{}

func (memoryCheck) Name() string { return "memory" }

func (memoryCheck) Holds(h *Host, l *Load) bool {
	return h.MemoryBytes == 0 || l.MemoryBytes <= h.MemoryBytes
}

func (memoryCheck) Fit(h *Host, l *Load, v *VM, _ *Scratch) (bool, Reason) {
	if h.MemoryBytes == 0 || v.MemoryBytes == 0 || add(l.MemoryBytes, v.MemoryBytes) <= h.MemoryBytes {
		return true, Reason{}
	}
	free := max(h.MemoryBytes-l.MemoryBytes, 0)
	return false, Reason{Check: "memory", Text: fmt.Sprintf("memory: needs %s, free %s of %s (short %s)",
		Size(v.MemoryBytes), Size(free), Size(h.MemoryBytes), Size(v.MemoryBytes-free))}
}

func (memoryCheck) Broken(h *Host, l *Load, _ []*VM) []string {
	return []string{fmt.Sprintf("memory: %s configured > %s (short %s)",
		Size(l.MemoryBytes), Size(h.MemoryBytes), Size(l.MemoryBytes-h.MemoryBytes))}
}

// pinCheck: a vNIC pinned to an uplink needs that uplink, up. (A VM that
// runs keeps running when its pinned uplink is lost: an unreserved vNIC's
// traffic then goes by the host's other uplinks; a reserving vNIC's
// reservation is a misfit that uplinkCheck reports.)
type pinCheck struct{}

func (pinCheck) Name() string                        { return "network.pin" }
func (pinCheck) Holds(*Host, *Load) bool             { return true }
func (pinCheck) Broken(*Host, *Load, []*VM) []string { return nil }

func (pinCheck) Fit(h *Host, _ *Load, v *VM, _ *Scratch) (bool, Reason) {
	for _, n := range v.NICs {
		if n.Uplink != "" && upIndex(h, n.Uplink) < 0 {
			return false, Reason{Check: "network.pin", NIC: n.Name,
				Text: fmt.Sprintf("network: %s is pinned to uplink %s, which the host lacks or has lost", n.Name, n.Uplink)}
		}
	}
	return true, Reason{}
}

// networkCheck: every vNIC reservation lies whole on one uplink that is
// up (its pinned one, if any), within the uplink's vm budget, as the
// packer assigns them. The sum of the reservations against the sum of the
// budgets is the quick test, and the first reason given.
type networkCheck struct{}

func (networkCheck) Name() string { return "network" }

func (networkCheck) Holds(h *Host, l *Load) bool {
	return l.NetBps <= h.BudgetBps() && l.packing(h).misfits == 0
}

func (networkCheck) Fit(h *Host, l *Load, v *VM, s *Scratch) (bool, Reason) {
	need := v.NetBps()
	if need == 0 {
		return true, Reason{}
	}
	if b := h.BudgetBps(); add(l.NetBps, need) > b {
		free := max(b-l.NetBps, 0)
		return false, Reason{Check: "network", NIC: onlyNIC(v), Text: fmt.Sprintf("network: needs %s of vNIC reservations, free %s (short %s; vm budget of %s)",
			Rate(need), Rate(free), Rate(need-free), uplinkList(h))}
	}
	if l.fitsNICs(h, v, s) {
		return true, Reason{}
	}
	// Name the first vNIC of v that does not fit on top of the host's
	// packing, with the uplink that has the most left.
	used := s.used(len(h.Uplinks))
	copy(used, l.packing(h).used)
	for k := range v.NICs {
		n := &v.NICs[k]
		if n.ReservationBps == 0 || take(h, used, n) {
			continue
		}
		if n.Uplink != "" && upIndex(h, n.Uplink) < 0 {
			return false, Reason{Check: "network", NIC: n.Name, Text: fmt.Sprintf("network: %s needs %s on uplink %s, which the host lacks or has lost", n.Name, Rate(n.ReservationBps), n.Uplink)}
		}
		most := mostFree(h, used, n)
		if most < 0 {
			return false, Reason{Check: "network", NIC: n.Name, Text: fmt.Sprintf("network: %s needs %s on one uplink, and no uplink is up", n.Name, Rate(n.ReservationBps))}
		}
		u := &h.Uplinks[most]
		left := max(u.BudgetBps-used[most], 0)
		return false, Reason{Check: "network", NIC: n.Name, Text: fmt.Sprintf("network: %s needs %s on one uplink, the most free is %s on %s (short %s; %s allows %s for vNICs: %s)",
			n.Name, Rate(n.ReservationBps), Rate(left), u.Name, Rate(n.ReservationBps-left), u.Name, Rate(u.BudgetBps), u.Why)}
	}
	// Each vNIC of v fits on top, but packed afresh, largest first, with
	// the host's vNICs, one does not: the packing the derivation uses
	// cannot hold them all.
	return false, Reason{Check: "network", NIC: onlyNIC(v), Text: fmt.Sprintf("network: packed largest first with the host's vNICs, the reservations %s of %s cannot be split so that each vNIC fits on one uplink (vm budget of %s)",
		Rate(need), v.Name, uplinkList(h))}
}

func (networkCheck) Broken(h *Host, l *Load, _ []*VM) []string {
	if b := h.BudgetBps(); l.NetBps > b {
		return []string{fmt.Sprintf("network: vNIC reservations %s > vm budget of %s (short %s)", Rate(l.NetBps), uplinkList(h), Rate(l.NetBps-b))}
	}
	return []string{fmt.Sprintf("network: vNIC reservations %s cannot be split so that each vNIC fits on one uplink (vm budget of %s)", Rate(l.NetBps), uplinkList(h))}
}

// onlyNIC is the name of v's one reserving vNIC, or "" when it has
// several.
func onlyNIC(v *VM) string {
	nic := ""
	for _, n := range v.NICs {
		if n.ReservationBps > 0 {
			if nic != "" {
				return ""
			}
			nic = n.Name
		}
	}
	return nic
}

// BudgetBps is the sum of the vm budgets of h's uplinks that are up.
func (h *Host) BudgetBps() int64 {
	var sum int64
	for _, u := range h.Uplinks {
		if !u.Down {
			sum = add(sum, u.BudgetBps)
		}
	}
	return sum
}

// upIndex is the index of h's uplink called name if it is up, or -1.
func upIndex(h *Host, name string) int {
	for j := range h.Uplinks {
		if h.Uplinks[j].Name == name && !h.Uplinks[j].Down {
			return j
		}
	}
	return -1
}

// uplinkList renders h's uplinks with their budgets and where each comes
// from: "uplink [vmnic0 7.5Gbps (reservationCap 0.75 × 10Gbps)]",
// "uplinks [vmnic0 4.8Gbps (the vm class reservation), vmnic1 down]".
func uplinkList(h *Host) string {
	var ups []string
	for _, u := range h.Uplinks {
		switch {
		case u.Down:
			ups = append(ups, u.Name+" down")
		case u.Why != "":
			ups = append(ups, fmt.Sprintf("%s %s (%s)", u.Name, Rate(u.BudgetBps), u.Why))
		default:
			ups = append(ups, fmt.Sprintf("%s %s", u.Name, Rate(u.BudgetBps)))
		}
	}
	where := "uplinks"
	if len(h.Uplinks) == 1 {
		where = "uplink"
	}
	if len(ups) == 0 {
		return "uplinks [none]"
	}
	return where + " [" + strings.Join(ups, ", ") + "]"
}
