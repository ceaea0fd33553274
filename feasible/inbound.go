package feasible

import "fmt"

// inboundCheck: the inbound reservations of the vNICs that receive
// through each uplink fit the uplink's inbound budget (Uplink.InBudgetBps).
// A vNIC receives through the uplink it sends by (the fabric learns its
// address there), so the uplinks are the packer's (Assign, as the
// derivation uses it): inbound reservations never move a vNIC, they only
// have to fit where it is.
type inboundCheck struct{}

func (inboundCheck) Name() string { return "network.inbound" }

func (inboundCheck) Holds(h *Host, l *Load) bool {
	if l.InBps == 0 {
		return true
	}
	return over(h, inUsed(h, l, nil)) < 0
}

func (inboundCheck) Fit(h *Host, l *Load, v *VM, _ *Scratch) (bool, Reason) {
	if v.InBps() == 0 {
		return true, Reason{}
	}
	at, nics, used := inAssign(h, l, v)
	j := over(h, used)
	if j < 0 {
		return true, Reason{}
	}
	// Name v's largest inbound reservation on the uplink that overflows.
	var nic *NIC
	for i := range nics {
		n := &nics[i]
		if at[i] == j && n.VM == vmIndex(v) && n.InReservationBps > 0 && (nic == nil || n.InReservationBps > nic.InReservationBps) {
			nic = n
		}
	}
	u := &h.Uplinks[j]
	need := v.InBps()
	name := ""
	if nic != nil {
		name, need = nic.Name, nic.InReservationBps
	}
	free := max(u.InBudgetBps-(used[j]-need), 0)
	return false, Reason{Check: "network.inbound", NIC: name, Text: fmt.Sprintf("network: inbound %s needs %s on uplink %s, free %s (short %s; %s allows %s inbound for vNICs: %s)",
		orVM(name, v), Rate(need), u.Name, Rate(free), Rate(need-free), u.Name, Rate(u.InBudgetBps), u.InWhy)}
}

func (inboundCheck) Broken(h *Host, l *Load, _ []*VM) []string {
	used := inUsed(h, l, nil)
	var out []string
	for j := range h.Uplinks {
		u := &h.Uplinks[j]
		if !u.Down && used[j] > u.InBudgetBps {
			out = append(out, fmt.Sprintf("network: inbound vNIC reservations %s on uplink %s > its inbound budget %s (%s; short %s)",
				Rate(used[j]), u.Name, Rate(u.InBudgetBps), u.InWhy, Rate(used[j]-u.InBudgetBps)))
		}
	}
	return out
}

// inUsed is the inbound reservation on each uplink of h of the vNICs of
// l and v (v may be nil).
func inUsed(h *Host, l *Load, v *VM) []int64 {
	_, _, used := inAssign(h, l, v)
	return used
}

// inAssign assigns the vNICs of l and v (may be nil) by the packer and
// sums their inbound reservations per uplink.
func inAssign(h *Host, l *Load, v *VM) (at []int, nics []NIC, used []int64) {
	nics = make([]NIC, 0, len(l.NICs)+len(l.InNICs)+4)
	nics = append(append(nics, l.NICs...), l.InNICs...)
	if v != nil {
		for _, n := range v.NICs {
			if n.ReservationBps > 0 || n.InReservationBps > 0 {
				nics = append(nics, n)
			}
		}
	}
	at, _ = Assign(h, nics)
	used = make([]int64, len(h.Uplinks))
	for i, j := range at {
		if j >= 0 {
			used[j] = add(used[j], nics[i].InReservationBps)
		}
	}
	return at, nics, used
}

// over is the first uplink of h that is up and whose inbound use exceeds
// its inbound budget, or -1.
func over(h *Host, used []int64) int {
	for j := range h.Uplinks {
		if !h.Uplinks[j].Down && used[j] > h.Uplinks[j].InBudgetBps {
			return j
		}
	}
	return -1
}

// vmIndex is the VM index its vNICs carry (-1 without vNICs).
func vmIndex(v *VM) int {
	if len(v.NICs) == 0 {
		return -1
	}
	return v.NICs[0].VM
}

func orVM(nic string, v *VM) string {
	if nic != "" {
		return nic
	}
	return v.Name
}
