package placement

import (
	"math"

	"sluice/entitle"
	"sluice/policy"
)

// state is the working copy of a cluster that one Plan call mutates: every
// host's used capacity and every VM's host and vNIC-to-uplink assignment.
// All quantities are float64 in the unit their name says.
type state struct {
	p     *policy.Policy
	hosts []host
	vms   []vm
	// hostIdx and vmIdx map names to indices.
	hostIdx map[string]int
	vmIdx   map[string]int

	pools []pool
	dss   []datastore

	// balance keeps the sums behind the imbalance metric (balance.go).
	bal balance
	// scratch is reusable space for trial packings.
	scratch []float64
	// vmotionLimit is the vmotion class limit in bits/s, 0 if none.
	vmotionLimit float64
}

// host is one host's capacity and what its VMs take of it.
type host struct {
	name     string
	cores    int
	cpuCap   float64 // MHz: cores × MHz per core
	memCap   float64 // bytes
	uplinks  []uplink
	cpuResv  float64  // MHz reserved by its VMs
	mem      float64  // bytes configured for its VMs
	cpuLoad  float64  // MHz: sum of VM CPU entitlements (balance)
	memLoad  float64  // bytes: sum of VM memory entitlements (balance)
	netLoad  float64  // bps: sum of vNIC entitlements (balance, optional)
	netResv  float64  // bps: sum of vNIC reservations (placement tie-break)
	netCap   float64  // bps: sum of up uplinks' usable capacity
	budget   float64  // bps: sum of up uplinks' vNIC reservation budgets
	tooBig   int      // VMs with more vCPUs than the host has cores
	nicList  []nicRef // reserving vNICs of its VMs in packing order (valid if nicOK)
	nicOK    bool
	netBad   bool   // the vNIC reservations could not be packed on uplinks
	vms      []int  // VM indices, in no particular order
	classErr string // class reservations exceed the cap on some uplink
}

// uplink is one physical NIC of a host and the vNIC reservations on it.
type uplink struct {
	name   string
	speed  float64 // bps line rate
	usable float64 // bps payload capacity
	down   bool
	budget float64 // bps the vNIC reservations on it may take
	used   float64 // bps reserved by vNICs assigned to it
}

// nicReq is what one vNIC asks of an uplink.
type nicReq struct {
	name string
	resv float64 // bps
	load float64 // bps entitlement for the optional network balance term
	pin  string  // uplink name it is pinned to, or ""
	pool int     // index into state.pools, or -1
}

// vm is one VM's requirements and where it is.
type vm struct {
	name       string
	host       int // -1: not placed
	pos        int // index in hosts[host].vms
	vcpus      int
	cpuResv    float64 // MHz
	mem        float64 // bytes
	cpuLoad    float64 // MHz entitlement for balance
	memLoad    float64 // bytes entitlement for balance
	nics       []nicReq
	nicUp      []int // uplink index per vNIC (-1 when it reserves nothing)
	netResv    float64
	netLoad    float64
	iops       []diskReq
	migratable bool
	changed    bool // named in Options.Changed
}

// diskReq is one disk's IOPS reservation on a datastore.
type diskReq struct {
	ds   int
	iops float64
}

// pool is a network resource pool: a quota on its vNICs' reservations.
type pool struct {
	name  string
	quota float64 // bps
	used  float64 // bps reserved by placed VMs' vNICs
	hosts []int   // hosts it spans
}

// datastore is shared storage with an IOPS capacity.
type datastore struct {
	name string
	cap  float64 // IOPS: slots / service time per 4 KiB I/O
	used float64 // IOPS reserved by placed VMs' disks
}

// capIOPS is the capacity of a datastore's array: Slots parallel servers,
// each completing one 4 KiB I/O per ServiceTime (policy.Datastore.ArrayIOPS).
// Unbounded when the file gives no array.
func capIOPS(a policy.Array) float64 {
	ns := a.ServiceTime.Nanoseconds()
	if a.Slots <= 0 || ns <= 0 {
		return math.Inf(1)
	}
	return float64(a.Slots) * 1e9 / float64(ns)
}

// newState compiles p with the placement cur (VM → host; nil means the
// hosts the policy gives) and the demand d.
func newState(p *policy.Policy, cur Placement, d Demand, o *Options) *state {
	s := &state{p: p, hostIdx: map[string]int{}, vmIdx: map[string]int{}}
	capFrac := p.ReservationCap
	if capFrac <= 0 || capFrac > 1 {
		capFrac = policy.DefaultReservationCap
	}
	var vmClassR, otherR float64
	for _, c := range p.TrafficClasses {
		if c.Name == "vmotion" && c.Limit != policy.Unlimited {
			s.vmotionLimit = entitle.RateLimit(c.Limit)
		}
		if c.Name == "vm" {
			vmClassR = float64(c.Reservation)
		} else {
			otherR += float64(c.Reservation)
		}
	}
	down := map[string]bool{}
	for _, u := range o.DownUplinks {
		down[u] = true
	}
	for i, ph := range p.Hosts {
		h := host{name: ph.Name, cores: ph.CPU.Cores,
			cpuCap: float64(ph.CPU.Cores) * float64(ph.CPU.MHz), memCap: float64(ph.Memory)}
		for _, pu := range ph.Uplinks {
			u := uplink{name: pu.Name, speed: float64(pu.Speed), usable: float64(pu.Usable)}
			if u.usable <= 0 {
				u.usable = u.speed
			}
			u.down = down[ph.Name+"/"+pu.Name]
			capBps := capFrac * u.speed
			if otherR+vmClassR > capBps+1e-6 {
				h.classErr = "class reservations " + fmtRate(otherR+vmClassR) + " exceed " +
					fmtPct(capFrac) + " of " + u.name + " " + fmtRate(u.speed)
			}
			if vmClassR > 0 {
				u.budget = math.Min(vmClassR, capBps-otherR)
			} else {
				u.budget = capBps - otherR
			}
			if u.budget < 0 || u.down {
				u.budget = 0
			}
			if !u.down {
				h.netCap += u.usable
				h.budget += u.budget
			}
			h.uplinks = append(h.uplinks, u)
		}
		s.hostIdx[ph.Name] = i
		s.hosts = append(s.hosts, h)
	}
	pgPool := map[string]int{}
	for i, np := range p.NetworkPools {
		pl := pool{name: np.Name, quota: float64(np.Reservation)}
		for _, pg := range np.PortGroups {
			pgPool[pg] = i
		}
		pl.hosts = s.poolHosts(np)
		s.pools = append(s.pools, pl)
	}
	dsIdx := map[string]int{}
	for i, pd := range p.Datastores {
		dsIdx[pd.Name] = i
		s.dss = append(s.dss, datastore{name: pd.Name, cap: capIOPS(pd.Array)})
	}
	changed := map[string]bool{}
	for _, n := range o.Changed {
		changed[n] = true
	}
	for i, pv := range p.VMs {
		v := vm{name: pv.Name, host: -1, vcpus: pv.CPU.VCPUs, cpuResv: float64(pv.CPU.ReservationMHz),
			mem: float64(pv.Memory), migratable: pv.Migratable, changed: changed[pv.Name]}
		v.cpuLoad = v.cpuResv
		if dm, ok := d.CPUMHz[pv.Name]; ok {
			v.cpuLoad = math.Max(dm, v.cpuResv)
			if pv.CPU.LimitMHz > 0 {
				v.cpuLoad = math.Min(v.cpuLoad, float64(pv.CPU.LimitMHz))
			}
		}
		v.memLoad = v.mem
		if dm, ok := d.MemoryBytes[pv.Name]; ok {
			v.memLoad = math.Min(dm, v.mem)
		}
		for _, pn := range pv.NICs {
			if pn.Passthrough {
				v.migratable = false
			}
			n := nicReq{name: pn.Name, resv: float64(pn.Reservation), pin: pn.Uplink, pool: -1}
			if pi, ok := pgPool[pn.PortGroup]; ok {
				n.pool = pi
			}
			n.load = n.resv
			if dn, ok := d.NetBps[policy.PortName(pv.Name, pn.Name)]; ok {
				n.load = math.Min(math.Max(n.resv, dn), entitle.RateLimit(pn.Limit))
			}
			v.netResv += n.resv
			v.netLoad += n.load
			v.nics = append(v.nics, n)
		}
		v.nicUp = make([]int, len(v.nics))
		for k := range v.nicUp {
			v.nicUp[k] = -1
		}
		for _, pd := range pv.Disks {
			if di, ok := dsIdx[pd.Datastore]; ok && pd.ReservationIOPS > 0 {
				v.iops = append(v.iops, diskReq{ds: di, iops: float64(pd.ReservationIOPS)})
			}
		}
		s.vmIdx[pv.Name] = i
		s.vms = append(s.vms, v)
	}
	// Place the VMs where they are, without checking: faults are found after.
	for i := range s.vms {
		hn := p.VMs[i].Host
		if cur != nil {
			hn = cur[s.vms[i].name]
		}
		if hi, ok := s.hostIdx[hn]; ok {
			s.attach(i, hi)
		}
	}
	for hi := range s.hosts {
		s.repack(hi)
	}
	s.bal.init(s, o)
	return s
}

// poolHosts is the set of hosts a pool spans: those it names, or every
// host of the cluster when it names none.
func (s *state) poolHosts(np policy.NetworkPool) []int {
	var hs []int
	for _, n := range np.Hosts {
		if hi, ok := s.hostIdx[n]; ok {
			hs = append(hs, hi)
		}
	}
	if len(np.Hosts) == 0 {
		for i := range s.hosts {
			hs = append(hs, i)
		}
	}
	return hs
}

// attach puts VM vi on host hi and adds its requirements, without packing
// its vNICs (callers pack or repack).
func (s *state) attach(vi, hi int) {
	v, h := &s.vms[vi], &s.hosts[hi]
	v.host, v.pos = hi, len(h.vms)
	h.vms = append(h.vms, vi)
	h.nicOK = false
	h.cpuResv += v.cpuResv
	h.mem += v.mem
	h.cpuLoad += v.cpuLoad
	h.memLoad += v.memLoad
	h.netLoad += v.netLoad
	h.netResv += v.netResv
	if v.vcpus > h.cores {
		h.tooBig++
	}
	for _, n := range v.nics {
		if n.pool >= 0 {
			s.pools[n.pool].used += n.resv
		}
	}
	for _, d := range v.iops {
		s.dss[d.ds].used += d.iops
	}
}

// detach removes VM vi from its host and releases its uplink reservations.
func (s *state) detach(vi int) {
	v := &s.vms[vi]
	h := &s.hosts[v.host]
	last := h.vms[len(h.vms)-1]
	h.vms[v.pos] = last
	s.vms[last].pos = v.pos
	h.vms = h.vms[:len(h.vms)-1]
	h.nicOK = false
	h.cpuResv -= v.cpuResv
	h.mem -= v.mem
	h.cpuLoad -= v.cpuLoad
	h.memLoad -= v.memLoad
	h.netLoad -= v.netLoad
	h.netResv -= v.netResv
	if v.vcpus > h.cores {
		h.tooBig--
	}
	for k, n := range v.nics {
		if u := v.nicUp[k]; u >= 0 {
			h.uplinks[u].used -= n.resv
			v.nicUp[k] = -1
		}
		if n.pool >= 0 {
			s.pools[n.pool].used -= n.resv
		}
	}
	for _, d := range v.iops {
		s.dss[d.ds].used -= d.iops
	}
	v.host = -1
}

// move migrates VM vi to host hi, keeping the balance sums current.
func (s *state) move(vi, hi int) {
	if s.vms[vi].host >= 0 {
		s.unplace(vi)
	}
	s.place(vi, hi)
}

// unplace takes VM vi off its host.
func (s *state) unplace(vi int) {
	from := s.vms[vi].host
	s.bal.remove(s, from)
	s.detach(vi)
	if s.hosts[from].netBad {
		s.repack(from)
	}
	s.bal.add(s, from)
}

// place puts VM vi (not placed) on host hi and packs its vNICs.
func (s *state) place(vi, hi int) {
	s.bal.remove(s, hi)
	s.attach(vi, hi)
	if !s.packVM(vi, hi) {
		s.repack(hi)
	}
	s.bal.add(s, hi)
}

// hostOK reports whether host hi meets every reservation of its VMs.
func (s *state) hostOK(hi int) bool {
	h := &s.hosts[hi]
	return h.cpuResv <= h.cpuCap+1e-6 && h.mem <= h.memCap+0.5 && !h.netBad && h.tooBig == 0
}

// fits reports whether VM vi (wherever it is now) would fit on host hi as
// hi is now. It changes nothing.
func (s *state) fits(vi, hi int) bool {
	v, h := &s.vms[vi], &s.hosts[hi]
	if v.host == hi || !s.hostOK(hi) || v.vcpus > h.cores || h.cpuResv+v.cpuResv > h.cpuCap+1e-6 || h.mem+v.mem > h.memCap+0.5 {
		return false
	}
	for _, n := range v.nics {
		if n.pin != "" && uplinkByName(h, n.pin) < 0 {
			return false
		}
	}
	if v.netResv == 0 {
		return true
	}
	if h.netResv+v.netResv > h.budget+1e-6 {
		return false
	}
	return s.tryPack(vi, hi)
}
