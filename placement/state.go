package placement

import (
	"math"
	"slices"

	"sluice/entitle"
	"sluice/feasible"
	"sluice/policy"
)

// state is the working copy of a cluster that one Plan call mutates: every
// host's used capacity and every VM's host. Whether a VM fits a host, and
// why not, is package feasible's to say (fits, hostOK, shortfalls); the
// balance and the costs of moves are float64 in the unit their name says.
type state struct {
	p     *policy.Policy
	hosts []host
	vms   []vm
	// hostIdx and vmIdx map names to indices.
	hostIdx map[string]int
	vmIdx   map[string]int
	// pgPool maps a port group to the pool its vNICs draw on; dsIdx a
	// datastore's name to its index.
	pgPool map[string]int
	dsIdx  map[string]int

	pools []pool
	dss   []feasible.Quota // datastore IOPS

	// balance keeps the sums behind the imbalance metric (balance.go).
	bal balance
	// scratch is reusable space for the feasibility checks.
	scratch feasible.Scratch
	// vmotionLimit is the vmotion class limit in bits/s, 0 if none.
	vmotionLimit float64
}

// host is one host's capacity and what its VMs take of it.
type host struct {
	name string
	fh   feasible.Host // capacity as the checks see it (uplinks down marked)
	load feasible.Load // what its VMs take, and their vNICs' packing
	// For the balance: capacities (0 when not modelled) and loads.
	cpuCap   float64 // MHz: cores × MHz per core
	memCap   float64 // bytes
	netCap   float64 // bps: sum of up uplinks' usable capacity
	budget   float64 // bps: sum of up uplinks' vNIC reservation budgets
	cpuLoad  float64 // MHz: sum of VM CPU entitlements (balance)
	memLoad  float64 // bytes: sum of VM memory entitlements (balance)
	netLoad  float64 // bps: sum of vNIC entitlements (balance, optional)
	uplinks  []uplink
	vms      []int  // VM indices, in no particular order
	classErr string // class reservations exceed the cap on some uplink
}

// uplink is one physical NIC of a host.
type uplink struct {
	name   string
	speed  float64 // bps line rate
	usable float64 // bps payload capacity
	down   bool
}

// nicReq is what one vNIC asks of its pool.
type nicReq struct {
	resv int64   // bps
	load float64 // bps entitlement for the optional network balance term
	pool int     // index into state.pools, or -1
}

// vm is one VM's requirements and where it is.
type vm struct {
	name       string
	host       int // -1: not placed
	pos        int // index in hosts[host].vms
	fv         feasible.VM
	mem        float64 // bytes configured (the cost of migrating it)
	cpuLoad    float64 // MHz entitlement for balance
	memLoad    float64 // bytes entitlement for balance
	nics       []nicReq
	netResv    float64 // bps: sum of vNIC reservations
	netLoad    float64
	iops       []diskReq
	migratable bool
	changed    bool // named in Options.Changed
}

// diskReq is one disk's IOPS reservation on a datastore.
type diskReq struct {
	ds   int
	iops int64
}

// pool is a network resource pool: a quota on its vNICs' reservations.
type pool struct {
	q     feasible.Quota
	hosts []int // hosts it spans
}

// newState compiles p with the placement cur (VM → host; nil means the
// hosts the policy gives) and the demand d: every VM, placed or not, at
// its index in p.VMs.
func newState(p *policy.Policy, cur Placement, d Demand, o *Options) *state {
	s := newHosts(p, o, nil)
	changed := map[string]bool{}
	for _, n := range o.Changed {
		changed[n] = true
	}
	s.vms = make([]vm, 0, len(p.VMs))
	s.vmIdx = make(map[string]int, len(p.VMs))
	for i := range p.VMs {
		pv := &p.VMs[i]
		s.vms = append(s.vms, s.compile(i, pv, d, changed[pv.Name]))
		s.vmIdx[pv.Name] = i
	}
	// Place the VMs where they are, without checking: faults are found after.
	for i := range s.vms {
		if hi := s.placedOn(cur, &p.VMs[i]); hi >= 0 {
			s.attach(i, hi)
		}
	}
	s.bal.init(s, o)
	return s
}

// newScopedState compiles p with the placement cur (as newState) for a
// check of the hosts in scope (indexed like p.Hosts; nil: none): only the
// VMs placed on those hosts are compiled and attached (s.vms holds them in
// file order, vmIdx finds them), while every placed VM draws on the
// network pools and datastores. Its cluster-wide quotas and the hosts in
// scope are those of newState; the other hosts carry nothing and have no
// capacity (newHosts). It has no balance: it serves checks, not Plan.
func newScopedState(p *policy.Policy, cur Placement, o *Options, scope []bool) *state {
	if scope == nil {
		scope = make([]bool, len(p.Hosts))
	}
	s := newHosts(p, o, scope)
	s.vmIdx = map[string]int{}
	quotas := len(s.pools) > 0 || len(s.dss) > 0
	some := slices.Contains(scope, true)
	if !quotas && !some {
		return s
	}
	var buf vm // the requirements of a VM out of scope, reused
	for i := range p.VMs {
		pv := &p.VMs[i]
		if !some {
			// Only the quotas count: where a VM that draws on none is
			// placed does not matter.
			if s.nets(pv, Demand{}, &buf); buf.draws() && s.placedOn(cur, pv) >= 0 {
				s.draw(&buf)
			}
			continue
		}
		hi := s.placedOn(cur, pv)
		switch {
		case hi < 0:
		case scope[hi]:
			vi := len(s.vms)
			s.vms = append(s.vms, s.compile(i, pv, Demand{}, false))
			s.vmIdx[pv.Name] = vi
			s.attach(vi, hi)
		case quotas:
			s.nets(pv, Demand{}, &buf)
			s.draw(&buf)
		}
	}
	return s
}

// newHosts compiles p's hosts, network pools and datastores, without VMs.
// Only the hosts in scope (indexed like p.Hosts; nil: every host) get
// their capacity (fh, budget, cpuCap, memCap); the others have their
// names, uplinks and class errors, what clusterFaults reads.
func newHosts(p *policy.Policy, o *Options, scope []bool) *state {
	s := &state{p: p, hostIdx: make(map[string]int, len(p.Hosts))}
	for _, c := range p.TrafficClasses {
		if c.Name == "vmotion" && c.Limit != policy.Unlimited {
			s.vmotionLimit = entitle.RateLimit(c.Limit)
		}
	}
	classes := p.Classes()
	down := map[string]bool{}
	for _, u := range o.DownUplinks {
		down[u] = true
	}
	s.hosts = make([]host, 0, len(p.Hosts))
	for i := range p.Hosts {
		ph := &p.Hosts[i]
		isDown := func(u string) bool { return down[ph.Name+"/"+u] }
		h := host{name: ph.Name}
		if scope == nil || scope[i] {
			h.fh = p.FeasibleHost(ph, isDown)
			h.cpuCap, h.memCap = float64(h.fh.CPUMHz()), float64(h.fh.MemoryBytes)
			h.budget = float64(h.fh.BudgetBps())
		}
		h.uplinks = make([]uplink, 0, len(ph.Uplinks))
		for _, pu := range ph.Uplinks {
			u := uplink{name: pu.Name, speed: float64(pu.Speed), usable: float64(pu.Usable), down: isDown(pu.Name)}
			if u.usable <= 0 {
				u.usable = u.speed
			}
			if ok, why := classes.Fit(int64(pu.Speed)); !ok && h.classErr == "" {
				h.classErr = "uplink " + u.name + ": " + why
			}
			if !u.down {
				h.netCap += u.usable
			}
			h.uplinks = append(h.uplinks, u)
		}
		s.hostIdx[ph.Name] = i
		s.hosts = append(s.hosts, h)
	}
	s.pgPool = map[string]int{}
	for i := range p.NetworkPools {
		np := &p.NetworkPools[i]
		for _, pg := range np.PortGroups {
			if _, taken := s.pgPool[pg]; !taken {
				s.pgPool[pg] = i
			}
		}
		s.pools = append(s.pools, pool{q: policy.PoolQuota(np), hosts: s.poolHosts(*np)})
	}
	s.dsIdx = map[string]int{}
	for i := range p.Datastores {
		s.dsIdx[p.Datastores[i].Name] = i
		s.dss = append(s.dss, p.Datastores[i].IOPSQuota())
	}
	return s
}

// compile is VM pv (index i in p.VMs) as placement sees it, not placed.
func (s *state) compile(i int, pv *policy.VM, d Demand, changed bool) vm {
	v := vm{name: pv.Name, host: -1, fv: policy.FeasibleVM(i, pv), mem: float64(pv.Memory),
		migratable: pv.Migratable, changed: changed}
	cpuResv := float64(pv.CPU.ReservationMHz)
	v.cpuLoad = cpuResv
	if dm, ok := d.CPUMHz[pv.Name]; ok {
		v.cpuLoad = math.Max(dm, cpuResv)
		if pv.CPU.LimitMHz > 0 {
			v.cpuLoad = math.Min(v.cpuLoad, float64(pv.CPU.LimitMHz))
		}
	}
	v.memLoad = v.mem
	if dm, ok := d.MemoryBytes[pv.Name]; ok {
		v.memLoad = math.Min(dm, v.mem)
	}
	s.nets(pv, d, &v)
	return v
}

// nets sets what pv's vNICs and disks ask of the network pools, the
// uplinks and the datastores in v (its nics, netResv, netLoad and iops,
// reusing their space); a passthrough vNIC makes v not migratable.
func (s *state) nets(pv *policy.VM, d Demand, v *vm) {
	v.nics, v.iops = v.nics[:0], v.iops[:0]
	v.netResv, v.netLoad = 0, 0
	if v.nics == nil && len(pv.NICs) > 0 {
		v.nics = make([]nicReq, 0, len(pv.NICs))
	}
	for _, pn := range pv.NICs {
		if pn.Passthrough {
			v.migratable = false
		}
		n := nicReq{resv: int64(pn.Reservation), pool: -1}
		if pi, ok := s.pgPool[pn.PortGroup]; ok {
			n.pool = pi
		}
		n.load = float64(n.resv)
		if d.NetBps != nil {
			if dn, ok := d.NetBps[policy.PortName(pv.Name, pn.Name)]; ok {
				n.load = math.Min(math.Max(float64(n.resv), dn), entitle.RateLimit(pn.Limit))
			}
		}
		v.netResv += float64(n.resv)
		v.netLoad += n.load
		v.nics = append(v.nics, n)
	}
	for _, pd := range pv.Disks {
		if di, ok := s.dsIdx[pd.Datastore]; ok && pd.ReservationIOPS > 0 {
			v.iops = append(v.iops, diskReq{ds: di, iops: int64(pd.ReservationIOPS)})
		}
	}
}

// placedOn is the index of the host VM pv is placed on in cur (nil: the
// host the policy gives), or -1.
func (s *state) placedOn(cur Placement, pv *policy.VM) int {
	hn := pv.Host
	if cur != nil {
		hn = cur[pv.Name]
	}
	if hi, ok := s.hostIdx[hn]; ok {
		return hi
	}
	return -1
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

// attach puts VM vi on host hi and adds its requirements.
func (s *state) attach(vi, hi int) {
	v, h := &s.vms[vi], &s.hosts[hi]
	v.host, v.pos = hi, len(h.vms)
	h.vms = append(h.vms, vi)
	h.load.Add(&h.fh, &v.fv)
	h.cpuLoad += v.cpuLoad
	h.memLoad += v.memLoad
	h.netLoad += v.netLoad
	s.draw(v)
}

// draws reports whether v reserves some of a network pool or datastore.
func (v *vm) draws() bool {
	for _, n := range v.nics {
		if n.pool >= 0 && n.resv > 0 {
			return true
		}
	}
	return len(v.iops) > 0
}

// draw counts what v reserves of the network pools and datastores.
func (s *state) draw(v *vm) {
	for _, n := range v.nics {
		if n.pool >= 0 {
			s.pools[n.pool].q.Add(n.resv)
		}
	}
	for _, d := range v.iops {
		s.dss[d.ds].Add(d.iops)
	}
}

// detach removes VM vi from its host and releases what it took.
func (s *state) detach(vi int) {
	v := &s.vms[vi]
	h := &s.hosts[v.host]
	last := h.vms[len(h.vms)-1]
	h.vms[v.pos] = last
	s.vms[last].pos = v.pos
	h.vms = h.vms[:len(h.vms)-1]
	h.load.Remove(&h.fh, &v.fv)
	h.cpuLoad -= v.cpuLoad
	h.memLoad -= v.memLoad
	h.netLoad -= v.netLoad
	for _, n := range v.nics {
		if n.pool >= 0 {
			s.pools[n.pool].q.Remove(n.resv)
		}
	}
	for _, d := range v.iops {
		s.dss[d.ds].Remove(d.iops)
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
	s.bal.add(s, from)
}

// place puts VM vi (not placed) on host hi.
func (s *state) place(vi, hi int) {
	s.bal.remove(s, hi)
	s.attach(vi, hi)
	s.bal.add(s, hi)
}

// hostOK reports whether host hi meets every reservation of its VMs
// (feasible.Holds).
func (s *state) hostOK(hi int) bool {
	h := &s.hosts[hi]
	return feasible.Holds(&h.fh, &h.load)
}

// fits reports whether VM vi (wherever it is now) would fit on host hi as
// hi is now (feasible.Fits). It changes nothing.
func (s *state) fits(vi, hi int) bool {
	v, h := &s.vms[vi], &s.hosts[hi]
	if v.host == hi {
		return false
	}
	return feasible.Fits(&h.fh, &h.load, &v.fv, &s.scratch)
}

// feasibleVMs returns the VMs of host hi as the checks see them, in file
// order.
func (s *state) feasibleVMs(hi int) []*feasible.VM {
	var out []*feasible.VM
	for _, vi := range s.hosts[hi].sortedVMs() {
		out = append(out, &s.vms[vi].fv)
	}
	return out
}
