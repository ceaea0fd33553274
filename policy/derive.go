package policy

import "sluice/feasible"

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
	return Bps(p.Classes().Reservable(int64(u.Speed)))
}

// VMClassBudget is what the vNIC reservations on an uplink may add up to
// (feasible.Classes.Budget): the vm class's reservation when the file
// gives one (> 0), else what the cap leaves after the other classes'
// reservations; never more than the latter, never negative.
func (p *Policy) VMClassBudget(u *Uplink) Bps {
	return Bps(p.Classes().Budget(int64(u.Speed)))
}

// VMClassInBudget is VMClassBudget for what the uplink receives: the
// same rule on the classes' ingress reservations.
func (p *Policy) VMClassInBudget(u *Uplink) Bps {
	return Bps(p.InClasses().Budget(int64(u.Speed)))
}

// AssignUplinks returns the uplink of every vNIC of vms on h, keyed by
// port name (VM/NIC). The rule is the one packer of package feasible,
// by which placement judges hosts, so that admission, placement, alloc
// and the agent agree: pinned vNICs, then larger reservations first (file
// order among equals), each to its pinned uplink or else the uplink with
// the least vm-class budget left that still holds it; a vNIC that fits
// nowhere goes, after all the others, to its pinned uplink or the one
// with the most budget left (where Admission and placement report it);
// vNICs without a reservation use their pinned uplink or the first one.
// vms are in file order. The caller may pass a copy of a host that lists
// only its uplinks that are up.
func (p *Policy) AssignUplinks(h *Host, vms []*VM) map[string]string {
	out := map[string]string{}
	if len(h.Uplinks) == 0 {
		return out
	}
	fh := p.FeasibleHost(h, nil)
	var nics []feasible.NIC
	var ports []string
	for vi, vm := range vms {
		for k, n := range vm.NICs {
			nics = append(nics, feasible.NIC{Name: n.Name, ReservationBps: int64(n.Reservation), Uplink: n.Uplink, VM: vi, Index: k})
			ports = append(ports, PortName(vm.Name, n.Name))
		}
	}
	at, _ := feasible.Assign(&fh, nics)
	for i, j := range at {
		if j >= 0 {
			out[ports[i]] = h.Uplinks[j].Name
		}
	}
	return out
}

// NICUplink returns the name of the uplink that the vNIC nic of vm sends
// through on the VM's host (see AssignUplinks for the rule), or "" when
// the VM has no host or the host has no uplink.
func (p *Policy) NICUplink(vm *VM, nic *NIC) string {
	h := p.Host(vm.Host)
	if h == nil {
		return ""
	}
	return p.AssignUplinks(h, p.VMsOn(h.Name))[PortName(vm.Name, nic.Name)]
}

// UplinkAssignment returns the uplink of every vNIC of every placed VM,
// keyed by port name (VM/NIC): NICUplink for all ports at once.
func (p *Policy) UplinkAssignment() map[string]string {
	all := map[string]string{}
	byHost := p.vmsByHost()
	for i := range p.Hosts {
		for port, u := range p.AssignUplinks(&p.Hosts[i], byHost[p.Hosts[i].Name]) {
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
