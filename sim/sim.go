package sim

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"sluice/entitle"
	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
)

// Sim is one run of a scenario: the cluster's models on one engine.
type Sim struct {
	eng      *Engine
	rec      *Recorder
	net      NetParams
	cpu      CPUParams
	st       StorageParams
	pardaCfg parda.Config
	pol      *policy.Policy // the scenario's policy, as loaded
	// cur is the one state of the cluster's policy: the scenario's with
	// every admitted change. What the uplinks schedule is derived from it
	// (resync).
	cur   *policy.Policy
	des   *entitle.Desired // the last derivation of cur (resync)
	sched string
	file  string

	uplinks map[string]*Uplink // HOST/UPLINK
	upOrder []*Uplink
	// inUplinks model what each uplink receives (HOST/UPLINK), when the
	// policy gives some port ingress settings; nil otherwise.
	inUplinks map[string]*Uplink
	ports     map[string]*Port // attached ports: VM/NIC or HOST/CLASS
	gauged    map[string]bool  // ports whose entitlement is recorded
	active    map[string]int   // running workloads per port
	// vmHost is the host each VM's traffic leaves from: a VM in flight
	// stays at its source until the move is done; "" runs nowhere.
	vmHost   map[string]string
	moving   map[string]string // VM in flight → its destination
	vcpus    map[string]*vcpu
	disks    map[string]*diskState
	dstores  map[string]*datastore
	loads    map[string]*workload
	loadList []*workload
	vmotion  float64  // bps a vMotion may use
	changed  []string // VMs in the order their reservations were last raised
	// fixedDemand replaces the demand the entitlements read from the
	// ports' activity (Entitlements); nil in a run.
	fixedDemand map[string]float64
	Log         []string // what happened (migrations, faults, errors)
}

type workload struct {
	spec    WorkloadSpec
	running bool
	// bulk, transfer and rr, parsed once from spec:
	windowBytes int64
	rateBps     float64
	totalBytes  int64 // a transfer's bytes; -1: endless
	streams     []*stream
	rr          *rr
	oltp        *oltp
	iom         *iometer
}

// newSim builds the cluster of sc for one run.
func newSim(sc *Scenario, run RunSpec) (*Sim, error) {
	s := &Sim{
		eng: NewEngine(sc.Seed), net: DefaultNetParams, cpu: DefaultCPUParams, st: DefaultStorageParams,
		pol: sc.pol, cur: sc.pol, sched: sc.Scheduler, file: sc.file,
		uplinks: map[string]*Uplink{}, ports: map[string]*Port{}, gauged: map[string]bool{},
		active: map[string]int{}, vmHost: map[string]string{}, moving: map[string]string{},
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
	switch run.Driver {
	case "", policy.DriverGateway, policy.DriverThrottle:
	default:
		return nil, lineErr(sc.file, run.Line, "driver", "unknown driver %q (%s, %s)", run.Driver, policy.DriverGateway, policy.DriverThrottle)
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
	if c := m.CPU; c != (ModelSpec{}).CPU {
		s.cpu = CPUParams{CyclesPerByte: c.CyclesPerByte, CyclesPerPacket: c.CyclesPerPacket, CyclesPerAck: c.CyclesPerAck,
			AckBytes: c.AckBytes, MaxAckRate: c.MaxAckRate, OverheadMHz: c.OverheadMHz, PeakMHz: c.PeakMHz}
	}
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

	inbound := hasIngress(s.pol)
	for _, h := range s.pol.Hosts {
		for _, u := range h.Uplinks {
			up, err := newUplink(s.eng, h.Name, u.Name, float64(u.Speed), s.net, s.sched, s.pol, false)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", sc.file, err)
			}
			if inbound {
				in, err := newUplink(s.eng, h.Name, u.Name, float64(u.Speed), s.net, s.sched, s.pol, true)
				if err != nil {
					return nil, fmt.Errorf("%s: %v", sc.file, err)
				}
				in.series = s.rec.Series(prefLink + InPrefix + h.Name + "/" + u.Name)
				if s.inUplinks == nil {
					s.inUplinks = map[string]*Uplink{}
				}
				s.inUplinks[h.Name+"/"+u.Name] = in
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
		h := s.pol.Host(vm.Host)
		if h == nil {
			continue // runs nowhere (Entitlements; a scenario places every VM)
		}
		s.vmHost[vm.Name] = vm.Host
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
	}
	for _, d := range s.pol.Datastores {
		// policy applies the defaults of serviceTime, congestionThreshold
		// and controlPeriod at load and refuses values that are not positive.
		ds := &datastore{s: s, name: d.Name, slots: d.Array.Slots, st4kNs: float64(d.Array.ServiceTime),
			sioc: d.SIOC.Enabled, siocPolicy: d.SIOC, threshNs: float64(d.SIOC.CongestionThreshold), periodNs: int64(d.SIOC.ControlPeriod),
			driver: datastoreDriver(&d, run.Driver)}
		if s.st.TransferMBps <= 0 {
			ds.size = parda.SizeModel{FixedNs: 0, NsPerKiB: ds.st4kNs / 4, RefBytes: 8 << 10}
		} else {
			ds.size = parda.SizeModel{NsPerKiB: 1024 / (s.st.TransferMBps * 1e6) * 1e9, RefBytes: 8 << 10}
			ds.size.FixedNs = ds.st4kNs - 4*ds.size.NsPerKiB
		}
		s.dstores[d.Name] = ds
		ds2 := ds
		s.rec.Gauge(prefDSLat+d.Name, func() float64 { return ds2.lastLatNs / 1e6 })
	}
	if err := s.resync(); err != nil {
		return nil, fmt.Errorf("%s: %v", sc.file, err)
	}
	for _, spec := range s.des.Datastores {
		ds := s.dstores[spec.Name]
		for _, dk := range spec.Disks {
			if ds.driver == policy.DriverThrottle {
				d := s.addThrottleDisk(ds, dk)
				d.specs = []specAt{{spec: dk}}
				ds.dks = append(ds.dks, d)
				s.disks[dk.Name] = d
				continue
			}
			hq := s.hostQ(ds, dk.Host)
			d := &diskState{name: dk.Name, host: hq, id: len(hq.disks), iops: s.rec.Series(prefIOPS + dk.Name), lat: s.rec.Series(prefLat + dk.Name)}
			d.params = mclock.Params{ReservationIOPS: dk.ReservationIOPS, Shares: max(dk.Shares, 1), LimitIOPS: dk.LimitIOPS}
			d.shares = d.params.Shares
			d.spec, d.specs = dk, []specAt{{spec: dk}}
			ds.dks = append(ds.dks, d)
			if err := hq.mc.AddClient(d.id, d.params); err != nil {
				return nil, fmt.Errorf("%s: disk %s: %v", sc.file, dk.Name, err)
			}
			hq.disks = append(hq.disks, d)
			s.disks[dk.Name] = d
		}
	}
	for _, w := range sc.Workloads {
		if err := s.addWorkload(w); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// hasIngress says some vNIC or class of p has an ingress setting.
func hasIngress(p *policy.Policy) bool {
	for _, tc := range p.TrafficClasses {
		if tc.Ingress != nil {
			return true
		}
	}
	for _, vm := range p.VMs {
		for _, n := range vm.NICs {
			if n.Ingress != nil {
				return true
			}
		}
	}
	return false
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
