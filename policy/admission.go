package policy

import (
	"fmt"
	"strconv"
	"time"
)

// Admission checks the capacity rules of DESIGN.md §2 that a file alone
// decides, for a policy that Decode accepted:
//   - per host and uplink, the class reservations ≤ reservationCap × speed;
//   - every vNIC reservation fits on one uplink (of its host, or of some
//     host when it is not placed), and the vNIC reservations on an uplink
//     fit in its vm class;
//   - a pool's quota ≤ reservationCap × the uplink speed of its hosts, and
//     the vNIC reservations of its port groups ≤ its quota;
//   - the CPU and memory reservations of the VMs on a host fit the host
//     (when the file gives the host's CPU or memory);
//   - the IOPS reservations on a datastore fit its array (when the file
//     gives the array).
//
// It returns nil when all hold.
func (p *Policy) Admission() Errors {
	l := &errorList{file: p.File}
	p.checkUplinks(l)
	p.checkPools(l)
	p.checkHostResources(l)
	p.checkDatastores(l)
	if len(l.errs) == 0 {
		return nil
	}
	return l.result()
}

func capText(p *Policy, u *Uplink) string {
	return fmt.Sprintf("reservationCap %s × %s = %s", strconv.FormatFloat(p.ReservationCap, 'f', -1, 64), FormatRate(u.Speed), FormatRate(p.Reservable(u)))
}

func (p *Policy) checkUplinks(l *errorList) {
	vmClass := p.TrafficClass("vm")
	classes := p.otherClassesReservation()
	if vmClass.Reservation > 0 {
		classes = addSat(classes, vmClass.Reservation)
	}
	// Largest vm-class budget of any uplink: what an unplaced vNIC needs.
	var best Bps
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		for ui := range h.Uplinks {
			u := &h.Uplinks[ui]
			best = max(best, p.VMClassBudget(u))
			if classes > p.Reservable(u) {
				l.add(u.Pos.FieldLine("speed"), listPath(listPath("hosts", h.Name, hi)+".uplinks", u.Name, ui)+".speed",
					"traffic class reservations total %s, more than %s", FormatRate(classes), capText(p, u))
			}
		}
	}
	byHost := p.vmsByHost()
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		a := p.assign(h, byHost[h.Name])
		used := map[string]Bps{}
		for _, vm := range byHost[h.Name] {
			for _, nic := range vm.NICs {
				if nic.Reservation == 0 {
					continue
				}
				field := listPath("vms["+vm.Name+"].nics", nic.Name, 0) + ".reservation"
				if len(h.Uplinks) == 0 {
					l.add(nic.Pos.FieldLine("reservation"), field, "host %s has no uplink to reserve %s on", h.Name, FormatRate(nic.Reservation))
					continue
				}
				un := a.uplink[PortName(vm.Name, nic.Name)]
				u := h.Uplink(un)
				budget := p.VMClassBudget(u)
				if used[un]+nic.Reservation > budget {
					l.add(nic.Pos.FieldLine("reservation"), field, "%s does not fit on host %s: %s", FormatRate(nic.Reservation), h.Name, p.budgetText(h, u, used[un]))
				}
				used[un] = addSat(used[un], nic.Reservation)
			}
		}
	}
	p.checkUnnamed(l)
	for _, vm := range p.VMs {
		if vm.Host != "" {
			continue
		}
		for _, nic := range vm.NICs {
			if nic.Reservation > best {
				l.add(nic.Pos.FieldLine("reservation"), "vms["+vm.Name+"].nics["+nic.Name+"].reservation",
					"%s fits on no uplink of any host (at most %s can be reserved for vNICs on one uplink)", FormatRate(nic.Reservation), FormatRate(best))
			}
		}
	}
}

// checkUnnamed checks that the reservation of an unnamed VM's vNIC fits
// on an uplink of every host that has uplinks.
func (p *Policy) checkUnnamed(l *errorList) {
	r := p.UnnamedVMs.Reservation
	if r == 0 {
		return
	}
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		var best Bps
		for ui := range h.Uplinks {
			best = max(best, p.VMClassBudget(&h.Uplinks[ui]))
		}
		if len(h.Uplinks) > 0 && r > best {
			l.add(p.UnnamedVMs.Pos.FieldLine("reservation"), "unnamedVMs.reservation",
				"%s fits on no uplink of host %s (at most %s can be reserved for vNICs on one uplink)", FormatRate(r), h.Name, FormatRate(best))
			return
		}
	}
}

// budgetText explains an uplink's vm-class budget for a message.
func (p *Policy) budgetText(h *Host, u *Uplink, used Bps) string {
	budget := p.VMClassBudget(u)
	what := fmt.Sprintf("the vm class reservation %s", FormatRate(budget))
	if vm := p.TrafficClass("vm"); vm.Reservation == 0 {
		what = capText(p, u)
		if other := p.otherClassesReservation(); other > 0 {
			what += fmt.Sprintf(" minus the other classes' %s", FormatRate(other))
		}
	}
	if used == 0 {
		return fmt.Sprintf("uplink %s allows %s for vNICs (%s)", u.Name, FormatRate(budget), what)
	}
	return fmt.Sprintf("uplink %s has %s of %s left for vNICs (%s; %s already reserved by other vNICs)", u.Name, FormatRate(max(budget-used, 0)), FormatRate(budget), what, FormatRate(used))
}

func (p *Policy) checkPools(l *errorList) {
	poolOf := map[string]int{} // port group → pool index
	for i, np := range p.NetworkPools {
		for _, pg := range np.PortGroups {
			if _, taken := poolOf[pg]; !taken {
				poolOf[pg] = i
			}
		}
	}
	for i, np := range p.NetworkPools {
		path := listPath("networkPools", np.Name, i)
		var span Bps
		for _, hn := range np.Hosts {
			if h := p.Host(hn); h != nil {
				for ui := range h.Uplinks {
					span = addSat(span, p.Reservable(&h.Uplinks[ui]))
				}
			}
		}
		if np.Reservation > span {
			l.add(np.Pos.FieldLine("reservation"), path+".reservation",
				"quota %s is more than reservationCap × the uplink speed of its %d host(s) = %s", FormatRate(np.Reservation), len(np.Hosts), FormatRate(span))
		}
		var sum Bps
		for _, vm := range p.VMs {
			for _, nic := range vm.NICs {
				if pi, ok := poolOf[nic.PortGroup]; !ok || pi != i || nic.Reservation == 0 {
					continue
				}
				if addSat(sum, nic.Reservation) > np.Reservation {
					l.add(nic.Pos.FieldLine("reservation"), "vms["+vm.Name+"].nics["+nic.Name+"].reservation",
						"%s exceeds pool %s: its vNIC reservations would total %s, more than its quota %s", FormatRate(nic.Reservation), np.Name, FormatRate(addSat(sum, nic.Reservation)), FormatRate(np.Reservation))
				}
				sum = addSat(sum, nic.Reservation)
			}
		}
	}
}

func (p *Policy) checkHostResources(l *errorList) {
	byHost := p.vmsByHost()
	for _, h := range p.Hosts {
		capMHz := h.CPU.Cores * h.CPU.MHz
		var mhz int
		var mem Bytes
		for _, vm := range byHost[h.Name] {
			path := "vms[" + vm.Name + "]"
			if h.CPU.Cores > 0 && vm.CPU.VCPUs > h.CPU.Cores {
				l.add(vm.Pos.FieldLine("cpu.vcpus"), path+".cpu.vcpus", "%d vCPUs is more than the %d cores of host %s", vm.CPU.VCPUs, h.CPU.Cores, h.Name)
			}
			if capMHz > 0 && vm.CPU.ReservationMHz > 0 {
				mhz += vm.CPU.ReservationMHz
				if mhz > capMHz {
					l.add(vm.Pos.FieldLine("cpu.reservationMHz"), path+".cpu.reservationMHz", "CPU reservations on host %s would total %dMHz, more than its %d cores × %dMHz", h.Name, mhz, h.CPU.Cores, h.CPU.MHz)
				}
			}
			if h.Memory > 0 && vm.Memory > 0 {
				mem += vm.Memory
				if mem > h.Memory {
					l.add(vm.Pos.FieldLine("memory"), path+".memory", "memory of the VMs on host %s would total %s, more than its %s", h.Name, formatSize(mem), formatSize(h.Memory))
				}
			}
		}
	}
}

// ArrayIOPS is the 4 KiB IOPS that the datastore's array serves at most:
// Slots / ServiceTime.
func (ds *Datastore) ArrayIOPS() IOPS {
	if ds.Array.ServiceTime <= 0 {
		return UnlimitedIOPS
	}
	return IOPS(int64(ds.Array.Slots) * int64(time.Second) / int64(ds.Array.ServiceTime))
}

func (p *Policy) checkDatastores(l *errorList) {
	for _, ds := range p.Datastores {
		if _, given := ds.Pos.Fields["array"]; !given {
			continue
		}
		limit := ds.ArrayIOPS()
		var sum IOPS
		for _, vm := range p.VMs {
			for _, dk := range vm.Disks {
				if dk.Datastore != ds.Name || dk.ReservationIOPS == 0 {
					continue
				}
				sum += dk.ReservationIOPS
				if sum > limit {
					l.add(dk.Pos.FieldLine("reservationIOPS"), "vms["+vm.Name+"].disks["+dk.Name+"].reservationIOPS",
						"IOPS reservations on datastore %s would total %d, more than its array serves (%d slots / %s = %d IOPS)", ds.Name, sum, ds.Array.Slots, ds.Array.ServiceTime, limit)
				}
			}
		}
	}
}

// formatSize renders a size with the largest binary unit that divides it.
func formatSize(b Bytes) string {
	for i := len(sizeUnitNames) - 1; i > 0; i-- {
		u := sizeUnitNames[i]
		if m := sizeUnits[u]; int64(b) >= m && int64(b)%m == 0 {
			return strconv.FormatInt(int64(b)/m, 10) + u
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
