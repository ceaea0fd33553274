package policy

import (
	"fmt"
	"slices"
	"time"

	"sluice/feasible"
)

// Admission checks the capacity rules of DESIGN.md §2 that a file alone
// decides, for a policy that Decode accepted, with the checks of package
// feasible (the ones placement and the hook apply):
//   - per host and uplink, the class reservations ≤ reservationCap × speed;
//   - the VMs placed on a host fit it, taken in file order as placement
//     admits them: their vCPUs and CPU reservations (when the file gives
//     the host's CPU), their memory (when it gives the host's memory),
//     their vNICs' pinned uplinks, and their vNIC reservations, each whole
//     on one uplink within its vm-class budget, as the packer assigns
//     them. A VM that does not fit is reported and not counted, so that
//     each problem is reported once, at the VM that does not fit beside
//     the ones before it;
//   - the vNIC reservation of a VM without a host fits on one uplink of
//     some host, and that of unnamedVMs on one uplink of every host;
//   - a pool's quota ≤ reservationCap × the uplink speed of its hosts, and
//     the vNIC reservations of its port groups (all VMs) ≤ its quota;
//   - the IOPS reservations on a datastore (all VMs) fit its array (when
//     the file gives the array).
//
// It returns nil when all hold.
func (p *Policy) Admission() Errors {
	l := &errorList{file: p.File}
	p.checkClasses(l)
	p.checkHosts(l)
	p.checkUnplaced(l)
	p.checkUnnamed(l)
	p.checkPools(l)
	p.checkDatastores(l)
	if len(l.errs) == 0 {
		return nil
	}
	return l.result()
}

func (p *Policy) checkClasses(l *errorList) {
	c, in := p.Classes(), p.InClasses()
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		for ui := range h.Uplinks {
			u := &h.Uplinks[ui]
			if ok, why := c.Fit(int64(u.Speed)); !ok {
				l.add(u.Pos.FieldLine("speed"), listPath(listPath("hosts", h.Name, hi)+".uplinks", u.Name, ui)+".speed", "%s", why)
			}
			if ok, why := in.Fit(int64(u.Speed)); !ok {
				l.add(u.Pos.FieldLine("speed"), listPath(listPath("hosts", h.Name, hi)+".uplinks", u.Name, ui)+".speed", "inbound: %s", why)
			}
		}
	}
}

// checkHosts checks that each host meets the reservations of the VMs
// placed on it (feasible.Holds, as placement judges a host); on a host
// that does not, it admits the VMs in file order through the checks and
// reports each that does not fit beside those before it.
func (p *Policy) checkHosts(l *errorList) {
	index := map[*VM]int{}
	for i := range p.VMs {
		index[&p.VMs[i]] = i
	}
	var s feasible.Scratch
	byHost := p.vmsByHost()
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		fh := p.FeasibleHost(h, nil)
		vms := make([]feasible.VM, len(byHost[h.Name]))
		var load feasible.Load
		for i, vm := range byHost[h.Name] {
			vms[i] = FeasibleVM(index[vm], vm)
			load.Add(&fh, &vms[i])
		}
		if feasible.Holds(&fh, &load) {
			continue // as placement sees it: the host meets its VMs' reservations
		}
		load = feasible.Load{}
		for i, vm := range byHost[h.Name] {
			fv := &vms[i]
			why := feasible.Why(&fh, &load, fv, &s)
			for _, r := range why {
				line, field := vmField(vm, r)
				l.add(line, field, "does not fit on host %s: %s", h.Name, r.Text)
			}
			if len(why) == 0 {
				load.Add(&fh, fv)
			}
		}
	}
}

// vmField is the line and path of the field of vm that a reason is about.
func vmField(vm *VM, why feasible.Reason) (int, string) {
	path := "vms[" + vm.Name + "]"
	switch why.Check {
	case "cpu.vcpus":
		return vm.Pos.FieldLine("cpu.vcpus"), path + ".cpu.vcpus"
	case "cpu.cores":
		return vm.Pos.FieldLine("latency"), path + ".latency"
	case "cpu.reservation":
		if vm.LatencySensitive {
			// What it reserves is its cores, whatever its reservationMHz.
			return vm.Pos.FieldLine("latency"), path + ".latency"
		}
		return vm.Pos.FieldLine("cpu.reservationMHz"), path + ".cpu.reservationMHz"
	case "memory":
		return vm.Pos.FieldLine("memory"), path + ".memory"
	}
	key := "reservation"
	switch why.Check {
	case "network.pin":
		key = "uplink"
	case "network.inbound":
		key = "ingress.reservation"
	}
	// The vNIC named, else the VM's largest reservation.
	var nic *NIC
	for k := range vm.NICs {
		n := &vm.NICs[k]
		if n.Name == why.NIC || why.NIC == "" && (nic == nil || larger(n, nic, key == "ingress.reservation")) {
			nic = n
			if n.Name == why.NIC {
				break
			}
		}
	}
	if nic == nil {
		return vm.Pos.Line, path + ".nics"
	}
	return nic.Pos.FieldLine(key), path + ".nics[" + nic.Name + "]." + key
}

// larger says a reserves more than b (inbound when in).
func larger(a, b *NIC, in bool) bool {
	if in {
		return a.Ingress.ReservationBps() > b.Ingress.ReservationBps()
	}
	return a.Reservation > b.Reservation
}

// checkUnplaced checks that each vNIC reservation of a VM without a host
// fits on one uplink of some host (placement decides the rest when it is
// powered on).
func (p *Policy) checkUnplaced(l *errorList) {
	var best, bestIn int64
	for hi := range p.Hosts {
		fh := p.FeasibleHost(&p.Hosts[hi], nil)
		best = max(best, feasible.Room(&fh, ""))
		bestIn = max(bestIn, feasible.InRoom(&fh, ""))
	}
	for _, vm := range p.VMs {
		if vm.Host != "" {
			continue
		}
		for _, nic := range vm.NICs {
			if int64(nic.Reservation) > best {
				l.add(nic.Pos.FieldLine("reservation"), "vms["+vm.Name+"].nics["+nic.Name+"].reservation",
					"%s fits on no uplink of any host (at most %s can be reserved for vNICs on one uplink)", FormatRate(nic.Reservation), FormatRate(Bps(best)))
			}
			if r := nic.Ingress.ReservationBps(); int64(r) > bestIn {
				l.add(nic.Pos.FieldLine("ingress.reservation"), "vms["+vm.Name+"].nics["+nic.Name+"].ingress.reservation",
					"%s fits on no uplink of any host (at most %s can be reserved inbound for vNICs on one uplink)", FormatRate(r), FormatRate(Bps(bestIn)))
			}
		}
	}
}

// checkUnnamed checks that the reservation of an unnamed VM's vNIC fits
// on an uplink of every host that has uplinks.
func (p *Policy) checkUnnamed(l *errorList) {
	r := int64(p.UnnamedVMs.Reservation)
	if r == 0 {
		return
	}
	for hi := range p.Hosts {
		h := &p.Hosts[hi]
		fh := p.FeasibleHost(h, nil)
		if room := feasible.Room(&fh, ""); len(h.Uplinks) > 0 && r > room {
			l.add(p.UnnamedVMs.Pos.FieldLine("reservation"), "unnamedVMs.reservation",
				"%s fits on no uplink of host %s (at most %s can be reserved for vNICs on one uplink)", FormatRate(Bps(r)), h.Name, FormatRate(Bps(room)))
			return
		}
	}
}

func (p *Policy) checkPools(l *errorList) {
	c := p.Classes()
	for i := range p.NetworkPools {
		np := &p.NetworkPools[i]
		path := listPath("networkPools", np.Name, i)
		var speeds []int64
		for _, hn := range np.Hosts {
			if h := p.Host(hn); h != nil {
				for _, u := range h.Uplinks {
					speeds = append(speeds, int64(u.Speed))
				}
			}
		}
		if ok, why := c.PoolSpan(np.Name, int64(np.Reservation), len(np.Hosts), speeds); !ok {
			l.add(np.Pos.FieldLine("reservation"), path+".reservation", "%s", why)
		}
		q := PoolQuota(np)
		for _, vm := range p.VMs {
			for _, nic := range vm.NICs {
				if nic.Reservation == 0 || p.Pool(nic.PortGroup) != np {
					continue
				}
				if ok, why := q.Fit(int64(nic.Reservation)); !ok {
					l.add(nic.Pos.FieldLine("reservation"), "vms["+vm.Name+"].nics["+nic.Name+"].reservation", "%s", why)
					continue
				}
				q.Add(int64(nic.Reservation))
			}
		}
	}
}

// PoolQuota returns the pool's quota on its vNICs' reservations, none
// used.
func PoolQuota(np *NetworkPool) feasible.Quota {
	return feasible.Quota{Kind: "pool", Name: np.Name, Cap: int64(np.Reservation)}
}

// ArrayIOPS is the 4 KiB IOPS that the datastore's array serves at most:
// Slots / ServiceTime.
func (ds *Datastore) ArrayIOPS() IOPS {
	if ds.Array.ServiceTime <= 0 {
		return UnlimitedIOPS
	}
	return IOPS(int64(ds.Array.Slots) * int64(time.Second) / int64(ds.Array.ServiceTime))
}

// ArrayGiven reports whether the datastore's array is modelled: the file
// gives it (a datastore built in code, without positions, has it when its
// Array is set). Without an array a datastore bounds no IOPS reservation.
func (ds *Datastore) ArrayGiven() bool {
	if _, given := ds.Pos.Fields["array"]; given {
		return true
	}
	return ds.Pos.Line == 0 && ds.Array.Slots > 0 && ds.Array.ServiceTime > 0
}

// NominalIOPS is what the datastore serves by the policy: its capacity
// as admission counts it (IOPSQuota), else the default array's rate.
func (ds *Datastore) NominalIOPS() IOPS {
	if q := ds.IOPSQuota(); q.Cap != feasible.Unlimited {
		return IOPS(q.Cap)
	}
	return ds.ArrayIOPS()
}

// IOPSQuota returns the datastore's IOPS capacity as a quota, none used:
// the declared capacityIOPS, else ArrayIOPS when the array is given, else
// what its hosts measured, else unlimited.
func (ds *Datastore) IOPSQuota() feasible.Quota {
	q := feasible.Quota{Kind: "datastore", Name: ds.Name, Cap: feasible.Unlimited}
	switch {
	case ds.CapacityIOPS > 0:
		q.Cap = int64(ds.CapacityIOPS)
		q.Why = "its declared capacityIOPS"
	case ds.ArrayGiven():
		q.Cap = int64(ds.ArrayIOPS())
		q.Why = fmt.Sprintf("the array serves %d slots / %s", ds.Array.Slots, ds.Array.ServiceTime)
	case ds.MeasuredIOPS > 0:
		q.Cap = int64(ds.MeasuredIOPS)
		q.Why = "as its hosts measured it at its congestion threshold; the file declares no capacityIOPS"
	}
	return q
}

// WithMeasuredIOPS returns p with each datastore's MeasuredIOPS from m
// (IOPS by datastore, whole IOPS counted; absent or below 1: none). p is
// not changed: it is returned as it is when nothing differs, else a copy
// that shares all but its datastores with p.
func (p *Policy) WithMeasuredIOPS(m map[string]float64) *Policy {
	if p == nil || len(p.Datastores) == 0 {
		return p
	}
	measured := func(ds string) IOPS {
		if v := m[ds]; v >= 1 && v < float64(UnlimitedIOPS) {
			return IOPS(v)
		}
		return 0
	}
	same := true
	for i := range p.Datastores {
		same = same && p.Datastores[i].MeasuredIOPS == measured(p.Datastores[i].Name)
	}
	if same {
		return p
	}
	np := *p
	np.Datastores = slices.Clone(p.Datastores)
	for i := range np.Datastores {
		np.Datastores[i].MeasuredIOPS = measured(np.Datastores[i].Name)
	}
	return &np
}

func (p *Policy) checkDatastores(l *errorList) {
	for i := range p.Datastores {
		ds := &p.Datastores[i]
		q := ds.IOPSQuota()
		if q.Cap == feasible.Unlimited {
			continue
		}
		for _, vm := range p.VMs {
			for _, dk := range vm.Disks {
				if dk.Datastore != ds.Name || dk.ReservationIOPS == 0 {
					continue
				}
				if ok, why := q.Fit(int64(dk.ReservationIOPS)); !ok {
					l.add(dk.Pos.FieldLine("reservationIOPS"), "vms["+vm.Name+"].disks["+dk.Name+"].reservationIOPS", "%s", why)
					continue
				}
				q.Add(int64(dk.ReservationIOPS))
			}
		}
	}
}
