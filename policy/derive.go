package policy

import (
	"math"
	"sort"
)

// This file holds the views of a policy that several parts derive from it
// (placement, alloc, the agent, the simulator); they are computed on each
// call from the current fields, so a caller may move VMs between calls.

// Host returns the host named name, or nil.
func (p *Policy) Host(name string) *Host {
	for i := range p.Hosts {
		if p.Hosts[i].Name == name {
			return &p.Hosts[i]
		}
	}
	return nil
}

// VM returns the VM named name, or nil.
func (p *Policy) VM(name string) *VM {
	for i := range p.VMs {
		if p.VMs[i].Name == name {
			return &p.VMs[i]
		}
	}
	return nil
}

// Datastore returns the datastore named name, or nil.
func (p *Policy) Datastore(name string) *Datastore {
	for i := range p.Datastores {
		if p.Datastores[i].Name == name {
			return &p.Datastores[i]
		}
	}
	return nil
}

// TrafficClass returns the class named name (one of TrafficClassNames), or
// nil.
func (p *Policy) TrafficClass(name string) *TrafficClass {
	for i := range p.TrafficClasses {
		if p.TrafficClasses[i].Name == name {
			return &p.TrafficClasses[i]
		}
	}
	return nil
}

// Pool returns the network pool that holds portGroup, or nil when the
// port group is in no pool.
func (p *Policy) Pool(portGroup string) *NetworkPool {
	for i := range p.NetworkPools {
		for _, pg := range p.NetworkPools[i].PortGroups {
			if pg == portGroup {
				return &p.NetworkPools[i]
			}
		}
	}
	return nil
}

// Uplink returns the host's uplink named name, or nil.
func (h *Host) Uplink(name string) *Uplink {
	for i := range h.Uplinks {
		if h.Uplinks[i].Name == name {
			return &h.Uplinks[i]
		}
	}
	return nil
}

// vmsByHost indexes the placed VMs by host, in file order.
func (p *Policy) vmsByHost() map[string][]*VM {
	m := map[string][]*VM{}
	for i := range p.VMs {
		if h := p.VMs[i].Host; h != "" {
			m[h] = append(m[h], &p.VMs[i])
		}
	}
	return m
}

// VMsOn returns the VMs placed on the host, in file order.
func (p *Policy) VMsOn(host string) []*VM {
	var vms []*VM
	for i := range p.VMs {
		if p.VMs[i].Host == host && host != "" {
			vms = append(vms, &p.VMs[i])
		}
	}
	return vms
}

// Reservable is how much of an uplink class reservations may take:
// reservationCap × the uplink's Speed, in bits/s, rounded down.
func (p *Policy) Reservable(u *Uplink) Bps {
	return Bps(math.Floor(p.ReservationCap*float64(u.Speed) + 1e-6))
}

// VMClassBudget is what the vNIC reservations on an uplink may add up to:
// the vm class's reservation when the file gives one (> 0), else what the
// cap leaves after the other classes' reservations (never negative).
func (p *Policy) VMClassBudget(u *Uplink) Bps {
	if vm := p.TrafficClass("vm"); vm != nil && vm.Reservation > 0 {
		return vm.Reservation
	}
	left := p.Reservable(u) - p.otherClassesReservation()
	return max(left, 0)
}

// otherClassesReservation is the sum of the reservations of every class
// but vm (the same on every uplink).
func (p *Policy) otherClassesReservation() Bps {
	var sum Bps
	for _, tc := range p.TrafficClasses {
		if tc.Name != "vm" {
			sum = addSat(sum, tc.Reservation)
		}
	}
	return sum
}

// nicAssignment is the uplink of every vNIC of a host's VMs, and the vNIC
// reservations that end up on each uplink.
type nicAssignment struct {
	uplink   map[string]string // port name (VM/NIC) → uplink name
	reserved map[string]Bps    // uplink name → sum of vNIC reservations
}

// assign maps the vNICs of the VMs on host h to uplinks. The rule is the
// one placement packs by, so that admission, placement, alloc and the agent
// agree: a vNIC pinned with `uplink:` goes there; reserving vNICs follow,
// larger reservations first (file order among equals), each to the uplink
// with the least vm-class budget left that still holds it (best fit); if
// none does, to the uplink with the most budget left (the first of equals),
// where Admission reports it. vNICs without a reservation use the first
// uplink.
func (p *Policy) assign(h *Host, vms []*VM) nicAssignment {
	a := nicAssignment{uplink: map[string]string{}, reserved: map[string]Bps{}}
	if len(h.Uplinks) == 0 {
		return a
	}
	type ref struct {
		vm  *VM
		nic *NIC
	}
	var refs []ref
	for _, vm := range vms {
		for k := range vm.NICs {
			refs = append(refs, ref{vm, &vm.NICs[k]})
		}
	}
	sort.SliceStable(refs, func(i, j int) bool {
		ni, nj := refs[i].nic, refs[j].nic
		if (ni.Uplink != "") != (nj.Uplink != "") {
			return ni.Uplink != ""
		}
		return ni.Reservation > nj.Reservation
	})
	free := make([]Bps, len(h.Uplinks))
	for i := range h.Uplinks {
		free[i] = p.VMClassBudget(&h.Uplinks[i])
	}
	for _, r := range refs {
		nic := r.nic
		i := -1
		if nic.Uplink != "" {
			for j := range h.Uplinks {
				if h.Uplinks[j].Name == nic.Uplink {
					i = j
					break
				}
			}
		}
		if i < 0 && nic.Reservation == 0 {
			i = 0
		}
		if i < 0 {
			for j := range h.Uplinks {
				if free[j] >= nic.Reservation && (i < 0 || free[j] < free[i]) {
					i = j
				}
			}
		}
		if i < 0 {
			i = 0
			for j := range h.Uplinks {
				if free[j] > free[i] {
					i = j
				}
			}
		}
		name := h.Uplinks[i].Name
		a.uplink[PortName(r.vm.Name, nic.Name)] = name
		a.reserved[name] = addSat(a.reserved[name], nic.Reservation)
		free[i] -= nic.Reservation
	}
	return a
}

// AssignUplinks returns the uplink of every vNIC of vms on h (see assign
// for the rule), keyed by port name (VM/NIC). The caller may pass a copy of
// a host that lists only its uplinks that are up.
func (p *Policy) AssignUplinks(h *Host, vms []*VM) map[string]string {
	return p.assign(h, vms).uplink
}

// NICUplink returns the name of the uplink that the vNIC nic of vm sends
// through on the VM's host (see assign for the rule), or "" when the VM
// has no host or the host has no uplink.
func (p *Policy) NICUplink(vm *VM, nic *NIC) string {
	h := p.Host(vm.Host)
	if h == nil {
		return ""
	}
	return p.assign(h, p.VMsOn(h.Name)).uplink[PortName(vm.Name, nic.Name)]
}

// UplinkAssignment returns the uplink of every vNIC of every placed VM,
// keyed by port name (VM/NIC): NICUplink for all ports at once.
func (p *Policy) UplinkAssignment() map[string]string {
	all := map[string]string{}
	byHost := p.vmsByHost()
	for i := range p.Hosts {
		for port, u := range p.assign(&p.Hosts[i], byHost[p.Hosts[i].Name]).uplink {
			all[port] = u
		}
	}
	return all
}

// addSat adds two non-negative rates, saturating at Unlimited.
func addSat(a, b Bps) Bps {
	if a > Unlimited-b {
		return Unlimited
	}
	return a + b
}
