package policy

import "sluice/feasible"

// This file translates the model into the quantities of package feasible,
// the one list of "does this VM fit this host" checks and the one vNIC
// packer. Validation (Admission), placement and the derivation all go
// through these functions, so that they see a host, a VM and an uplink's
// budget alike.

// Classes returns what the traffic classes reserve on every uplink, which
// bounds the vNICs' budget there.
func (p *Policy) Classes() feasible.Classes {
	c := feasible.Classes{Cap: p.ReservationCap}
	for _, tc := range p.TrafficClasses {
		if tc.Name == "vm" {
			c.VMBps = int64(tc.Reservation)
		} else {
			c.OtherBps = int64(addSat(Bps(c.OtherBps), tc.Reservation))
		}
	}
	return c
}

// InClasses returns what the traffic classes reserve inbound on every
// uplink (their `ingress` reservations), which bounds the vNICs' inbound
// budget there by the same rule as the outbound one.
func (p *Policy) InClasses() feasible.Classes {
	c := feasible.Classes{Cap: p.ReservationCap}
	for _, tc := range p.TrafficClasses {
		if tc.Name == "vm" {
			c.VMBps = int64(tc.Ingress.ReservationBps())
		} else {
			c.OtherBps = int64(addSat(Bps(c.OtherBps), tc.Ingress.ReservationBps()))
		}
	}
	return c
}

// FeasibleHost returns h as the checks see it. down reports the uplinks
// that are lost (nil: none); they stay in the list, marked down.
func (p *Policy) FeasibleHost(h *Host, down func(uplink string) bool) feasible.Host {
	c, in := p.Classes(), p.InClasses()
	fh := feasible.Host{Name: h.Name, Cores: h.CPU.Cores, CoreMHz: int64(h.CPU.MHz), HostCores: h.CPU.HostCores, MemoryBytes: int64(h.Memory)}
	for _, u := range h.Uplinks {
		fu := c.Uplink(u.Name, int64(u.Speed), down != nil && down(u.Name))
		fu.InBudgetBps, fu.InWhy = in.Budget(int64(u.Speed)), in.BudgetWhy(int64(u.Speed))
		fh.Uplinks = append(fh.Uplinks, fu)
	}
	return fh
}

// FeasibleVM returns vm as the checks see it; index is its position among
// the cluster's VMs (file order), which breaks ties in the packing order.
// Its vNICs that reserve bandwidth (sending or receiving) or are pinned
// are named by their NIC name.
func FeasibleVM(index int, vm *VM) feasible.VM {
	fv := feasible.VM{Name: vm.Name, VCPUs: vm.CPU.VCPUs, CPUMHz: int64(vm.CPU.ReservationMHz), MemoryBytes: int64(vm.Memory), Pinned: vm.LatencySensitive}
	for k, n := range vm.NICs {
		if n.Reservation > 0 || n.Uplink != "" || n.Ingress.ReservationBps() > 0 {
			fv.NICs = append(fv.NICs, feasible.NIC{Name: n.Name, ReservationBps: int64(n.Reservation),
				InReservationBps: int64(n.Ingress.ReservationBps()), Uplink: n.Uplink, VM: index, Index: k})
		}
	}
	feasible.SortNICs(fv.NICs)
	return fv
}
