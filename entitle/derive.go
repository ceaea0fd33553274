package entitle

import (
	"slices"

	"sluice/alloc"
	"sluice/policy"
)

// Live is the state of the cluster that the derivation takes besides the
// policy. Its zero value means: every VM runs on the host the policy gives
// it, and every uplink is up.
type Live struct {
	// Hosts maps each running VM to the host it runs on now. Nil: every VM
	// runs on the host of the policy (VMs without one run nowhere). A VM
	// that a non-nil map does not name runs nowhere: it gets no class on
	// any uplink and no disk on any gateway. A VM in flight counts where
	// its traffic is sent from; the caller decides (the simulator keeps it
	// at the source until the move is done).
	Hosts map[string]string
	// DownUplinks holds the uplinks that are down, as HOST/UPLINK. They
	// keep their trees (with Down set) but no vNIC is assigned to them:
	// their vNICs go to the host's other uplinks by the usual rule.
	DownUplinks map[string]bool
	// Unnamed are the running VMs that the policy does not name (a
	// hypervisor's inventory knows them), each with its host and vNICs.
	// Every vNIC gets a class of its own in the vm class of its host with
	// the policy's unnamedVMs setting, on an uplink chosen by the rule of
	// the policy's vNICs. A VM whose name the policy has, or whose host
	// is not in the policy, is ignored.
	Unnamed []UnnamedVM
}

// UnnamedVM is a running VM that the policy does not name.
type UnnamedVM struct {
	Name string   // as the inventory names it (a libvirt domain name)
	Host string   // where it runs
	NICs []string // its vNICs, as the inventory names them: ports Name/NIC
}

// Desired is the desired state of a cluster derived from a policy and the
// live state: the scheduling tree of every host uplink and the disks of
// every datastore. It holds plain values: the CLI, the agent, the
// simulator and placement all read it, and none of them decides again
// which uplink a vNIC uses or what a class reserves.
type Desired struct {
	Uplinks []UplinkSpec // per host and uplink, in file order
	// Inbound are the inbound trees, one per host and uplink in the order
	// of Uplinks: what enters through the uplink towards the host's vNICs
	// that have an `ingress` setting (Inbound set). Same shape and rule as
	// the outbound trees, with the ports' ingress settings.
	Inbound    []UplinkSpec
	Datastores []DatastoreSpec // in file order
}

// UplinkSpec is the tree of one host uplink: uplink → traffic class →
// vNIC (DESIGN.md §2). Rates are payload bits/s, as the policy states them;
// limits are alloc.Inf when unlimited.
type UplinkSpec struct {
	Host, Uplink string
	SpeedBps     float64 // line rate
	UsableBps    float64 // what alloc divides: the uplink's usable rate, else its speed
	Down         bool    // the uplink is down: no vNIC is assigned to it
	// Inbound says the tree divides what the uplink receives towards the
	// host's vNICs (their ingress settings), not what it sends.
	Inbound bool
	Classes []ClassSpec
	// VFs are the SR-IOV virtual functions of running VMs whose PF is
	// this uplink (passthrough: vf), outbound trees only, in file order.
	// They bypass the tree: the NIC holds their rates in hardware. So
	// that the tree does not promise what they reserve, UsableBps is the
	// uplink's usable rate less their reservations (VFReservedBps), and a
	// vm class reservation given in the file is reduced by them too.
	VFs           []VFSpec `json:",omitempty"`
	VFReservedBps float64  `json:",omitempty"`
}

// VFSpec is the SR-IOV virtual function of a running VM's passthrough
// vNIC: the rates the agent sets on it through its PF, in whole Mbit/s
// as the kernel takes them (IFLA_VF_RATE; policy.NIC.VFTxRates).
type VFSpec struct {
	Port    string // VM/NIC
	VM, NIC string
	// MinTxMbps is the reservation (min_tx_rate), MaxTxMbps the limit
	// (max_tx_rate; 0: unlimited).
	MinTxMbps, MaxTxMbps uint32
}

// HasVNICs says some vNIC is on the tree.
func (u *UplinkSpec) HasVNICs() bool {
	for _, c := range u.Classes {
		if len(c.VNICs) > 0 {
			return true
		}
	}
	return false
}

// ClassSpec is one traffic class on an uplink, in policy.TrafficClassNames
// order. Only the vm class has VNICs.
type ClassSpec struct {
	Name           string // HOST/CLASS
	Class          string // the traffic class, e.g. "vm"
	ReservationBps float64
	Shares         float64
	LimitBps       float64 // alloc.Inf when unlimited
	// Declared says the policy file names the class: `sluice alloc` gives
	// it unbounded demand; an undeclared class carries no traffic.
	Declared bool
	VNICs    []VNICSpec // file order
}

// VNICSpec is one scheduled vNIC of a running VM. Passthrough vNICs
// bypass the scheduler and have none.
type VNICSpec struct {
	Port           string // VM/NIC
	VM, NIC        string
	ReservationBps float64
	Shares         float64
	LimitBps       float64 // alloc.Inf when unlimited
	// Unnamed says the VM runs but the policy does not name it: the
	// settings are the policy's unnamedVMs.
	Unnamed bool
	// LatencySensitive says the VM is latency: sensitive: the vNIC is
	// served before its siblings while within its rate.
	LatencySensitive bool `json:",omitempty"`
}

// DatastoreSpec is the set of disks of running VMs on one datastore.
type DatastoreSpec struct {
	Name  string
	Disks []DiskSpec // file order
}

// DiskSpec is one disk of a running VM: its I/O passes the storage gateway
// of Host.
type DiskSpec struct {
	Name            string // VM/DISK
	VM, Disk, Host  string
	ReservationIOPS float64
	Shares          float64
	LimitIOPS       float64 // alloc.Inf when unlimited
}

// RateLimit converts a policy rate limit to alloc's float64: policy.Unlimited
// is alloc.Inf. The policy refuses a limit of 0, so every other value is a
// real cap.
func RateLimit(l policy.Bps) float64 {
	if l == policy.Unlimited {
		return alloc.Inf
	}
	return float64(l)
}

// IOPSLimit converts a policy IOPS limit to alloc's float64:
// policy.UnlimitedIOPS is alloc.Inf.
func IOPSLimit(l policy.IOPS) float64 {
	if l == policy.UnlimitedIOPS {
		return alloc.Inf
	}
	return float64(l)
}

// Derive computes the desired state of the cluster of p given live. The
// rules (DESIGN.md §2), each decided here and nowhere else:
//   - an uplink divides its usable rate (its speed when none is given);
//   - a vNIC pinned with `uplink:` to an uplink that is up uses it; the
//     other vNICs of a host are assigned by the one packer of package
//     feasible (policy.AssignUplinks: larger reservations first, best fit
//     on the vm-class budget, a vNIC that fits nowhere last on the uplink
//     with the most left, unreserved vNICs on the first uplink), over the
//     uplinks that are up: the packing placement judges hosts by;
//   - passthrough vNICs bypass the scheduler: they are on no tree; an
//     SR-IOV VF (passthrough: vf) is listed on its PF's outbound tree
//     (UplinkSpec.VFs) with its rates, and its reservation is taken off
//     that tree's usable rate and off a vm class reservation the file
//     gives, so that the host's HTB never promises what the NIC reserves
//     for its VFs;
//   - each vNIC of a running VM that the policy does not name
//     (Live.Unnamed) is a vNIC with the policy's unnamedVMs setting,
//     after the policy's vNICs of its host;
//   - the vm class reserves what the file gives it, else the sum of its
//     vNICs' reservations on the uplink, at most its budget (reservationCap
//     × speed less the other classes' reservations), so that the other
//     classes keep their reservations while a fault is being repaired;
//   - limits are alloc.Inf when unlimited (RateLimit, IOPSLimit).
func Derive(p *policy.Policy, live Live) *Desired {
	d := &Desired{}
	onHost := runningVMs(p, live, nil)
	unnamed := unnamedVMs(p, live)
	for hi := range p.Hosts {
		d.Uplinks, d.Inbound = deriveHost(d.Uplinks, d.Inbound, p, &p.Hosts[hi], onHost, unnamed, live)
	}
	for _, ds := range p.Datastores {
		spec := DatastoreSpec{Name: ds.Name}
		for _, vm := range p.VMs {
			host := live.HostOf(&vm)
			if host == "" {
				continue
			}
			for _, dk := range vm.Disks {
				if dk.Datastore != ds.Name {
					continue
				}
				spec.Disks = append(spec.Disks, DiskSpec{Name: vm.Name + "/" + dk.Name, VM: vm.Name, Disk: dk.Name, Host: host,
					ReservationIOPS: float64(dk.ReservationIOPS), Shares: float64(dk.Shares), LimitIOPS: IOPSLimit(dk.LimitIOPS)})
			}
		}
		d.Datastores = append(d.Datastores, spec)
	}
	return d
}

// DeriveHosts is Derive for the hosts named in hosts: the uplink trees of
// those hosts, the same as Derive's and in the same order, and no
// datastores. A host's trees depend only on the host, the traffic classes
// and the VMs that run there, so deriving one port's host costs a pass
// over the VMs, not the trees of the cluster.
func DeriveHosts(p *policy.Policy, live Live, hosts []string) *Desired {
	want := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		want[h] = true
	}
	d := &Desired{}
	onHost := runningVMs(p, live, want)
	unnamed := unnamedVMs(p, live)
	for hi := range p.Hosts {
		if want[p.Hosts[hi].Name] {
			d.Uplinks, d.Inbound = deriveHost(d.Uplinks, d.Inbound, p, &p.Hosts[hi], onHost, unnamed, live)
		}
	}
	return d
}

// deriveHost appends the outbound and inbound trees of h's uplinks to out
// and in; onHost and unnamed are the VMs that run on each host, named by
// the policy or not. A vNIC receives through the uplink it sends by.
func deriveHost(out, in []UplinkSpec, p *policy.Policy, h *policy.Host, onHost, unnamed map[string][]*policy.VM, live Live) ([]UplinkSpec, []UplinkSpec) {
	vms := onHost[h.Name]
	if u := unnamed[h.Name]; len(u) > 0 {
		vms = slices.Concat(vms, u)
	}
	up := &policy.Host{Name: h.Name, CPU: h.CPU, Memory: h.Memory}
	for _, u := range h.Uplinks {
		if !live.DownUplinks[h.Name+"/"+u.Name] {
			up.Uplinks = append(up.Uplinks, u)
		}
	}
	assign := p.AssignUplinks(up, vms)
	for ui := range h.Uplinks {
		out = append(out, deriveUplink(p, h, &h.Uplinks[ui], vms, len(onHost[h.Name]), assign, live, false))
		in = append(in, deriveUplink(p, h, &h.Uplinks[ui], vms, len(onHost[h.Name]), assign, live, true))
	}
	return out, in
}

// rsl is a port's reservation, shares and limit in one direction.
type rsl struct {
	r      policy.Bps
	shares int
	l      policy.Bps
}

// classRSL is the setting of tc in one direction: inbound, its ingress
// (shares normal, no reservation, no limit when the file gives none;
// declared only when it does).
func classRSL(tc *policy.TrafficClass, inbound bool) (rsl, bool) {
	if !inbound {
		return rsl{tc.Reservation, tc.Shares, tc.Limit}, tc.Declared
	}
	if tc.Ingress == nil {
		return rsl{0, policy.NetSharesNormal, policy.Unlimited}, false
	}
	return rsl{tc.Ingress.Reservation, tc.Ingress.Shares, tc.Ingress.Limit}, true
}

// nicRSL is the setting of nic in one direction; inbound, a vNIC without
// ingress is not on the tree (false).
func nicRSL(nic *policy.NIC, inbound bool) (rsl, bool) {
	if !inbound {
		return rsl{nic.Reservation, nic.Shares, nic.Limit}, true
	}
	if nic.Ingress == nil {
		return rsl{}, false
	}
	return rsl{nic.Ingress.Reservation, nic.Ingress.Shares, nic.Ingress.Limit}, true
}

// deriveUplink derives one uplink's tree, outbound or inbound (the same
// rule on the ports' settings for that direction); vms[named:] are the
// running VMs that the policy does not name.
func deriveUplink(p *policy.Policy, h *policy.Host, u *policy.Uplink, vms []*policy.VM, named int, assign map[string]string, live Live, inbound bool) UplinkSpec {
	usable := u.Usable
	if usable <= 0 {
		usable = u.Speed
	}
	us := UplinkSpec{Host: h.Name, Uplink: u.Name, SpeedBps: float64(u.Speed), UsableBps: float64(usable),
		Down: live.DownUplinks[h.Name+"/"+u.Name], Inbound: inbound}
	if !inbound {
		us.VFs, us.VFReservedBps = vfsOn(u.Name, vms[:named])
		us.UsableBps = max(0, us.UsableBps-us.VFReservedBps)
	}
	for ti := range p.TrafficClasses {
		tc := &p.TrafficClasses[ti]
		set, declared := classRSL(tc, inbound)
		cs := ClassSpec{Name: policy.ClassName(h.Name, tc.Name), Class: tc.Name, ReservationBps: float64(set.r),
			Shares: float64(set.shares), LimitBps: RateLimit(set.l), Declared: declared}
		if tc.Name == "vm" {
			var sum float64
			for vi, vm := range vms {
				for k := range vm.NICs {
					nic := &vm.NICs[k]
					port := policy.PortName(vm.Name, nic.Name)
					ns, on := nicRSL(nic, inbound)
					if !on || nic.Passthrough || assign[port] != u.Name {
						continue
					}
					cs.VNICs = append(cs.VNICs, VNICSpec{Port: port, VM: vm.Name, NIC: nic.Name, ReservationBps: float64(ns.r),
						Shares: float64(ns.shares), LimitBps: RateLimit(ns.l), Unnamed: vi >= named, LatencySensitive: vm.LatencySensitive})
					sum += float64(ns.r)
				}
			}
			if set.r == 0 {
				budget := p.VMClassBudget(u)
				if inbound {
					budget = p.VMClassInBudget(u)
				}
				cs.ReservationBps = min(sum, float64(budget))
			} else if us.VFReservedBps > 0 {
				// The file's vm reservation covers the VFs too; they
				// hold theirs in the NIC, outside the tree.
				cs.ReservationBps = max(0, cs.ReservationBps-us.VFReservedBps)
			}
		}
		us.Classes = append(us.Classes, cs)
	}
	return us
}

// vfsOn lists the VFs of vms whose PF is uplink (in file order) and the
// whole Mbit/s they reserve, bits/s.
func vfsOn(uplink string, vms []*policy.VM) ([]VFSpec, float64) {
	var out []VFSpec
	var sum float64
	for _, vm := range vms {
		for k := range vm.NICs {
			nic := &vm.NICs[k]
			if !nic.VF || nic.Uplink != uplink {
				continue
			}
			lo, hi := nic.VFTxRates()
			out = append(out, VFSpec{Port: policy.PortName(vm.Name, nic.Name), VM: vm.Name, NIC: nic.Name, MinTxMbps: lo, MaxTxMbps: hi})
			sum += float64(lo) * float64(policy.MbpsBps)
		}
	}
	return out, sum
}

// runningVMs lists the running VMs of each host (of the hosts in only;
// nil: of every host), in file order.
func runningVMs(p *policy.Policy, live Live, only map[string]bool) map[string][]*policy.VM {
	m := map[string][]*policy.VM{}
	for i := range p.VMs {
		if h := live.HostOf(&p.VMs[i]); h != "" && (only == nil || only[h]) {
			m[h] = append(m[h], &p.VMs[i])
		}
	}
	return m
}

// unnamedVMs turns the running VMs that the policy does not name into
// VMs of their hosts whose every vNIC has the unnamedVMs setting (a VM or
// vNIC named twice counts once).
func unnamedVMs(p *policy.Policy, live Live) map[string][]*policy.VM {
	if len(live.Unnamed) == 0 {
		return nil
	}
	m := map[string][]*policy.VM{}
	set := p.UnnamedVNICSetting()
	seen := map[string]bool{}
	for _, u := range live.Unnamed {
		if seen[u.Name] || p.VM(u.Name) != nil || p.Host(u.Host) == nil {
			continue
		}
		seen[u.Name] = true
		vm := &policy.VM{Name: u.Name, Host: u.Host}
		nics := map[string]bool{}
		for _, n := range u.NICs {
			if nics[n] {
				continue
			}
			nics[n] = true
			vm.NICs = append(vm.NICs, policy.NIC{Name: n, Shares: set.Shares, Reservation: set.Reservation, Limit: set.Limit})
		}
		m[u.Host] = append(m[u.Host], vm)
	}
	return m
}

// HostOf is the host vm of the policy runs on in l: its policy host when
// l.Hosts is nil, else l.Hosts' entry; "" when it runs nowhere.
func (l Live) HostOf(vm *policy.VM) string {
	if l.Hosts == nil {
		return vm.Host
	}
	return l.Hosts[vm.Name]
}

// HostUplinks returns the uplink trees of host, in file order.
func (d *Desired) HostUplinks(host string) []UplinkSpec {
	var out []UplinkSpec
	for _, u := range d.Uplinks {
		if u.Host == host {
			out = append(out, u)
		}
	}
	return out
}

// Datastore returns the disk set of the named datastore, or nil.
func (d *Desired) Datastore(name string) *DatastoreSpec {
	for i := range d.Datastores {
		if d.Datastores[i].Name == name {
			return &d.Datastores[i]
		}
	}
	return nil
}
