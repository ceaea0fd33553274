package sim

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"sluice/alloc"
	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
)

var inf = math.Inf(1)

// Sim is one run of a scenario: the cluster's models on one engine.
type Sim struct {
	eng      *Engine
	rec      *Recorder
	net      NetParams
	cpu      CPUParams
	st       StorageParams
	pardaCfg parda.Config
	pol      *policy.Policy
	cur      *policy.Policy // the policy with the changes admitted so far
	sched    string
	file     string

	uplinks  map[string]*Uplink // HOST/UPLINK
	upOrder  []*Uplink
	ports    map[string]*Port // VM/NIC or HOST/CLASS
	portRSL  map[string]*rsl
	portUp   map[string]*Uplink
	active   map[string]int // running workloads per port
	vmHost   map[string]string
	vcpus    map[string]*vcpu
	disks    map[string]*diskState
	dstores  map[string]*datastore
	loads    map[string]*workload
	loadList []*workload
	vmotion  float64  // bps a vMotion may use
	changed  []string // VMs in the order their reservations were last raised
	Log      []string // what happened (migrations, faults)
}

type rsl struct{ res, shares, limit float64 }

type workload struct {
	spec    WorkloadSpec
	running bool
	streams []*stream
	rr      *rr
	oltp    *oltp
	iom     *iometer
}

func limitOf(l policy.Bps) float64 {
	if l == policy.Unlimited || l <= 0 {
		return inf
	}
	return float64(l)
}

func iopsLimit(l policy.IOPS) float64 {
	if l == policy.UnlimitedIOPS || l <= 0 {
		return inf
	}
	return float64(l)
}

// newSim builds the cluster of sc for one run.
func newSim(sc *Scenario, run RunSpec) (*Sim, error) {
	s := &Sim{
		eng: NewEngine(sc.Seed), net: DefaultNetParams, cpu: DefaultCPUParams, st: DefaultStorageParams,
		pol: sc.pol, cur: sc.pol, sched: sc.Scheduler, file: sc.file,
		uplinks: map[string]*Uplink{}, ports: map[string]*Port{}, portRSL: map[string]*rsl{},
		portUp: map[string]*Uplink{}, active: map[string]int{}, vmHost: map[string]string{},
		vcpus: map[string]*vcpu{}, disks: map[string]*diskState{}, dstores: map[string]*datastore{},
		loads: map[string]*workload{}, vmotion: 8e9,
	}
	if run.Scheduler != "" {
		s.sched = run.Scheduler
	}
	if s.sched == "" {
		s.sched = "netioc"
	}
	if s.sched != "netioc" && s.sched != "default" {
		return nil, lineErr(sc.file, run.Line, "scheduler", "unknown scheduler %q (netioc, default)", s.sched)
	}
	m := sc.Models
	var err error
	if s.net.SegmentBytes, err = parseSize(m.Net.Segment, s.net.SegmentBytes); err != nil {
		return nil, lineErr(sc.file, 1, "models.net.segment", "%v", err)
	}
	if s.net.BaseRTTNs, err = durNs(m.Net.BaseRTT, s.net.BaseRTTNs); err != nil {
		return nil, lineErr(sc.file, 1, "models.net.baseRTT", "%v", err)
	}
	if m.Net.PortQueue > 0 {
		s.net.PortQueue = m.Net.PortQueue
	}
	if s.vmotion, err = parseRate(m.Net.VMotion, s.vmotion); err != nil {
		return nil, lineErr(sc.file, 1, "models.net.vmotionRate", "%v", err)
	}
	setF := func(dst *float64, v float64) {
		if v != 0 {
			*dst = v
		}
	}
	setF(&s.cpu.CyclesPerByte, m.CPU.CyclesPerByte)
	setF(&s.cpu.CyclesPerPacket, m.CPU.CyclesPerPacket)
	setF(&s.cpu.OverheadMHz, m.CPU.OverheadMHz)
	setF(&s.cpu.PeakMHz, m.CPU.PeakMHz)
	setF(&s.st.TransferMBps, m.Storage.TransferMBps)
	setF(&s.st.Gamma, m.Storage.Gamma)
	setF(&s.st.BetaPerShare, m.Storage.BetaPerShare)
	s.st.PerSlot = s.st.PerSlot || m.Storage.PerSlot
	if m.Storage.HostQueue > 0 {
		s.st.HostQueue = m.Storage.HostQueue
	}
	s.st.Parda = m.Storage.Parda
	s.pardaCfg = parda.Config{Gamma: s.st.Gamma, BetaPerShare: s.st.BetaPerShare}
	s.rec = newRecorder(s.eng, sc.sampleNs)

	for _, h := range s.pol.Hosts {
		for _, u := range h.Uplinks {
			usable := float64(u.Usable)
			if usable <= 0 {
				usable = float64(u.Speed)
			}
			up, err := newUplink(s.eng, h.Name, u.Name, float64(u.Speed), usable, s.net, s.sched, s.pol)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", sc.file, err)
			}
			up.cpuHz = float64(h.CPU.MHz) * 1e6
			up.series = s.rec.Series(prefLink + h.Name + "/" + u.Name)
			if up.hc != nil {
				up.schedCPU = s.rec.Series(prefCPU + h.Name + "/" + u.Name + "/netsched")
			}
			s.uplinks[h.Name+"/"+u.Name] = up
			s.upOrder = append(s.upOrder, up)
		}
	}
	for _, vm := range s.pol.VMs {
		s.vmHost[vm.Name] = vm.Host
		h := s.pol.Host(vm.Host)
		if h == nil {
			return nil, fmt.Errorf("%s: vm %s: no host given (the simulator needs every VM placed)", sc.file, vm.Name)
		}
		c := &vcpu{eng: s.eng, p: s.cpu, busy: s.rec.Series(prefCPU + vm.Name), irqs: s.rec.Series(prefIRQ + vm.Name),
			irqNs: s.net.IRQCoalesceNs, irqCycles: s.net.CyclesPerIRQ}
		peak := s.cpu.PeakMHz
		if peak == 0 {
			peak = float64(h.CPU.MHz)
		}
		mhz := peak * float64(max(vm.CPU.VCPUs, 1))
		if vm.CPU.LimitMHz > 0 {
			mhz = math.Min(mhz, float64(vm.CPU.LimitMHz))
		}
		c.setMHz(mhz)
		s.vcpus[vm.Name] = c
		for _, n := range vm.NICs {
			name := policy.PortName(vm.Name, n.Name)
			s.portRSL[name] = &rsl{float64(n.Reservation), float64(n.Shares), limitOf(n.Limit)}
			s.attachPort(name, vm.Host, n.Uplink)
		}
	}
	for _, d := range s.pol.Datastores {
		ds := &datastore{s: s, name: d.Name, slots: max(d.Array.Slots, 1), st4kNs: float64(d.Array.ServiceTime),
			sioc: d.SIOC.Enabled, threshNs: float64(d.SIOC.CongestionThreshold), periodNs: int64(d.SIOC.ControlPeriod)}
		if ds.st4kNs <= 0 {
			ds.st4kNs = 5e6
		}
		if ds.threshNs <= 0 {
			ds.threshNs = 30e6
		}
		if ds.periodNs <= 0 {
			ds.periodNs = 4 * Second
		}
		ds.size = parda.SizeModel{FixedNs: ds.st4kNs, NsPerKiB: 0, RefBytes: 8 << 10}
		if s.st.TransferMBps <= 0 {
			ds.size = parda.SizeModel{FixedNs: 0, NsPerKiB: ds.st4kNs / 4, RefBytes: 8 << 10}
		} else {
			ds.size.NsPerKiB = 1024 / (s.st.TransferMBps * 1e6) * 1e9
			ds.size.FixedNs = ds.st4kNs - 4*ds.size.NsPerKiB
		}
		s.dstores[d.Name] = ds
		ds2 := ds
		s.rec.Gauge(prefDSLat+d.Name, func() float64 { return ds2.lastLatNs / 1e6 })
	}
	for _, vm := range s.pol.VMs {
		for _, dk := range vm.Disks {
			ds := s.dstores[dk.Datastore]
			if ds == nil {
				continue
			}
			hq := s.hostQ(ds, vm.Host)
			name := vm.Name + "/" + dk.Name
			d := &diskState{name: name, host: hq, id: len(hq.disks), iops: s.rec.Series(prefIOPS + name), lat: s.rec.Series(prefLat + name)}
			d.params = mclock.Params{ReservationIOPS: float64(dk.ReservationIOPS), Shares: float64(max(dk.Shares, 1)), LimitIOPS: iopsLimit(dk.LimitIOPS)}
			d.shares = d.params.Shares
			if err := hq.mc.AddClient(d.id, d.params); err != nil {
				return nil, fmt.Errorf("%s: disk %s: %v", sc.file, name, err)
			}
			hq.disks = append(hq.disks, d)
			s.disks[name] = d
		}
	}
	for _, w := range sc.Workloads {
		if err := s.addWorkload(w); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Sim) hostQ(ds *datastore, host string) *hostQ {
	for _, h := range ds.hosts {
		if h.name == host+"/"+ds.name {
			return h
		}
	}
	h := &hostQ{s: s, name: host + "/" + ds.name, ds: ds, window: float64(s.st.HostQueue), mc: mclock.New(mclock.Config{}), reqs: map[uint64]*ioReq{}}
	ds.hosts = append(ds.hosts, h)
	s.rec.Gauge(prefQDepth+h.name, func() float64 { return h.window })
	return h
}

// attachPort puts port name on an uplink of host (pinned or the first).
func (s *Sim) attachPort(name, host, pin string) {
	h := s.pol.Host(host)
	upName := pin
	if upName == "" && h != nil && len(h.Uplinks) > 0 {
		upName = h.Uplinks[0].Name
	}
	up := s.uplinks[host+"/"+upName]
	if up == nil || up.failed {
		for _, u := range s.upOrder {
			if u.Host == host && !u.failed {
				up = u
				break
			}
		}
	}
	if up == nil {
		return
	}
	class := s.classIndex("vm")
	if i := strings.IndexByte(name, '/'); i >= 0 && s.pol.Host(name[:i]) != nil {
		class = s.classIndex(name[i+1:])
	}
	r := s.portRSL[name]
	if r == nil {
		r = &rsl{0, 1, inf}
		s.portRSL[name] = r
	}
	pt := &Port{Name: name, series: s.rec.Series(prefRate + name), vcpu: s.vcpus[vmOf(name)]}
	pt.class = class
	if err := up.addPort(pt); err != nil {
		return
	}
	s.ports[name] = pt
	s.portUp[name] = up
	s.syncPort(name)
	if up.hc != nil {
		upc, ptc := up, pt
		s.rec.Gauge(prefEntitled+name, func() float64 {
			if s.ports[name] != ptc {
				return 0
			}
			return s.entitlements(upc)[name]
		})
	}
}

func (s *Sim) classIndex(name string) int {
	for i, c := range s.pol.TrafficClasses {
		if c.Name == name {
			return i
		}
	}
	return 1
}

// syncPort pushes a port's R/S/L into its uplink's scheduler, and the vm
// class reservation: when the policy gives none, the sum of its vNICs'
// reservations on the uplink, capped by the uplink's budget.
func (s *Sim) syncPort(name string) {
	up := s.portUp[name]
	if up == nil || up.hc == nil {
		return
	}
	vi := s.classIndex("vm")
	if s.ports[name].class == vi {
		r := s.portRSL[name]
		up.setParams(name, r.res, r.shares, r.limit)
	}
	s.syncClass(up)
}

func (s *Sim) syncClass(up *Uplink) {
	vi := s.classIndex("vm")
	tc := s.pol.TrafficClasses[vi]
	res := float64(tc.Reservation)
	if res == 0 {
		res = math.Min(s.reserved(up), s.vmBudget(up))
	}
	up.setParams("class:vm", res, float64(tc.Shares), limitOf(tc.Limit))
}

// entitlements computes with package alloc what every port of up is due
// now (demand unbounded for ports with a running workload or queued
// traffic): the reference the scheduler's rates are checked against.
func (s *Sim) entitlements(up *Uplink) map[string]float64 {
	now := s.eng.NowNs()
	if up.ent != nil && up.entAtNs == now {
		return up.ent
	}
	root := &alloc.Node{Name: "uplink", Shares: 1, Limit: alloc.Inf}
	vi := s.classIndex("vm")
	leaves := map[string]*alloc.Node{}
	for i, c := range s.pol.TrafficClasses {
		res := float64(c.Reservation)
		if i == vi && res == 0 {
			res = math.Min(s.reserved(up), s.vmBudget(up))
		}
		cn := &alloc.Node{Name: c.Name, Reservation: res, Shares: float64(c.Shares), Limit: limitOf(c.Limit)}
		for _, name := range sortedKeys(s.portUp) {
			pt := s.ports[name]
			if s.portUp[name] != up || pt.class != i {
				continue
			}
			d := 0.0
			if s.active[name] > 0 || len(pt.queue) > pt.qhead {
				d = alloc.Inf
			}
			r := s.portRSL[name]
			if i != vi {
				r = &rsl{0, 1, inf}
			}
			leaves[name] = &alloc.Node{Name: name, Reservation: r.res, Shares: r.shares, Limit: r.limit, Demand: d}
			cn.Children = append(cn.Children, leaves[name])
		}
		if len(cn.Children) > 0 {
			root.Children = append(root.Children, cn)
		}
	}
	ent := map[string]float64{}
	if len(root.Children) > 0 {
		compute(root, up.UsableBp)
		for n, l := range leaves {
			ent[n] = l.Alloc
		}
	}
	up.ent, up.entAtNs = ent, now
	return ent
}

func (s *Sim) portFor(name string) (*Port, error) {
	if pt := s.ports[name]; pt != nil {
		return pt, nil
	}
	i := strings.IndexByte(name, '/')
	if i < 0 || s.pol.Host(name[:i]) == nil {
		return nil, fmt.Errorf("unknown port %q (VM/NIC or HOST/CLASS)", name)
	}
	s.attachPort(name, name[:i], "")
	if s.ports[name] == nil {
		return nil, fmt.Errorf("host %s has no uplink", name[:i])
	}
	return s.ports[name], nil
}

func vmOf(port string) string {
	if i := strings.IndexByte(port, '/'); i >= 0 {
		return port[:i]
	}
	return port
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// parseCPULimit reads "800MHz", "15%" (of the host's core clock) or
// "unlimited" into MHz (0: unlimited).
func (s *Sim) parseCPULimit(vm, v string) (float64, error) {
	if v == "unlimited" || v == "" {
		return 0, nil
	}
	if p, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return 0, fmt.Errorf("bad percentage %q", v)
		}
		h := s.pol.Host(s.vmHost[vm])
		return f / 100 * float64(h.CPU.MHz), nil
	}
	if p, ok := strings.CutSuffix(v, "MHz"); ok {
		return strconv.ParseFloat(p, 64)
	}
	return 0, fmt.Errorf("bad CPU limit %q (MHz or %%)", v)
}
