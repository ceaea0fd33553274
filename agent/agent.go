package agent

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"sluice/alloc"
	"sluice/cpuctl"
	"sluice/policy"
)

// Config configures an Agent.
type Config struct {
	Policy *policy.Policy
	Host   string
	Kernel Kernel
	// Inventory tells which VMs run on the host, the uplink devices and
	// how vNIC packets are recognised.
	Inventory Inventory
	// Dynamic turns on dynamic enforcement: each Step sets guaranteed
	// rates from alloc's entitlements on measured demand. Off: static HTB.
	Dynamic bool
	// ClassPorts are the destination ports of host-level traffic by
	// traffic class; nil: DefaultClassPorts.
	ClassPorts map[string][]PortRange
	// Policies are new policies for the agent to take without a restart
	// (a reloaded file; the controller's updates): Run applies each one
	// with SetPolicy. Nil: the policy never changes.
	Policies <-chan *policy.Policy
	// RecordPath is the state file in which the agent records what it
	// changes on the host before changing it (RecordPath()); "": the
	// record is kept in memory only (tests).
	RecordPath string
	// RootsDir keeps, device by device, a copy of each root qdisc the
	// agent replaces (DefaultRootsDir), where `sluice agent uninstall`
	// finds it whatever the state file's directory; "": none (tests).
	RootsDir string
	// Cgroups sets and reads the CPU cgroups of the VMs (cpuctl.Detect for
	// the host's hierarchy, cpuctl.NewFake in tests): each step derives
	// every running VM's CPU setting (cpuctl.Derive) and reconciles the
	// group the inventory names for it (CgroupInventory). Nil: the agent
	// leaves CPU alone.
	Cgroups cpuctl.Cgroups
	// Pinner pins the vCPUs of the host's running domains when some VM of
	// the policy there is latency-sensitive (cpuctl.Pin: its vCPUs on
	// cores of their own, the other domains off them), with Cgroups set;
	// nil: no pinning. PinsPath records each domain's pinning before the
	// first change (PinsOriginalsPath; "": in memory only).
	Pinner   Pinner
	PinsPath string
	// NIC reads each uplink's NIC (nicinfo.Reader) at the first step and
	// again after each Resync or SetPolicy, never every step; the
	// statistics show it (UplinkStat.NIC). Nil: not read.
	NIC NICReader
	// VF reads and sets the rates of SR-IOV VFs (NetlinkVF; FakeVF in
	// tests): each step gives the VF of every running passthrough: vf
	// vNIC its rates, found through the inventory (VFInventory). Nil:
	// the agent leaves VFs alone.
	VF VFKernel
	// VFOriginalsPath is the file in which the agent records each VF's
	// rates before it first sets them (VFOriginalsPath()); "": in memory
	// only (tests).
	VFOriginalsPath string
}

// rateSmoothing is the weight of the newest interval in a port's measured
// rate (an exponentially weighted moving average).
const rateSmoothing = 0.5

// Agent reconciles the HTB trees of one host's uplinks.
type Agent struct {
	cfg     Config
	trees   []*Tree
	ports   map[string]*portState // by tree dev + "|" + node name
	lastNs  int64
	startNs int64 // time of the first step
	stats   Stats
	rec     *Record         // what the agent changed on the host
	taken   map[string]bool // uplinks checked and recorded by this agent
	// released are uplink devices that a new policy no longer names:
	// the next Apply gives them back their recorded root qdisc.
	released []string
	cpuVMs   []*cpuVM          // running VMs of the policy, in policy order
	cpuGone  map[string]string // group → VM of VMs that stopped: reset at the next Apply
	pins     pinState          // Config.Pinner's originals and last decision
	// vnicMissing holds when each vNIC device was first found missing.
	vnicMissing map[string]int64
	// nics are the uplinks' NICs as last read (Config.NIC), by device, at
	// nicReadNs; nicStale asks the next Measure to read them again.
	nics      map[string]*UplinkNIC
	nicStale  bool
	nicReadNs int64
	// vfOrig are the rates of the VFs the agent set, before it set them,
	// by PF/index (read from Config.VFOriginalsPath at the first step).
	vfOrig map[string]VFRate
}

type portState struct {
	lastBytes   uint64
	haveLast    bool
	rateBps     float64 // smoothed wire rate
	lastRateBps float64 // wire rate of the last interval
	samples     int
	demand      demand  // wire rates of the last intervals
	entBps      float64 // last entitlement, payload
	guarantee   float64 // last HTB rate set, wire
}

// Stats is what the agent reports: per uplink and port.
type Stats struct {
	Cluster string       `json:"cluster"`
	Host    string       `json:"host"`
	Dynamic bool         `json:"dynamic"`
	NowNs   int64        `json:"now_ns"`
	Uplinks []UplinkStat `json:"uplinks"`
	// Unnamed are the running VMs the policy does not name (when the
	// inventory knows them): each of their vNICs has a class of its own
	// with the policy's unnamedVMs setting.
	Unnamed []string `json:"unnamed,omitempty"`
	// CPU is each running VM's CPU setting and use (Config.Cgroups);
	// CPUCapacityMHz is the host's cores × MHz that they share.
	CPU            []CPUStat `json:"cpu,omitempty"`
	CPUCapacityMHz float64   `json:"cpu_capacity_mhz,omitempty"`
	// VFs are the SR-IOV VF vNICs of the running VMs (Config.VF).
	VFs []VFStat `json:"vfs,omitempty"`
}

// UplinkStat is one uplink's tree.
type UplinkStat struct {
	Uplink    string     `json:"uplink"`
	Dev       string     `json:"dev"`
	SpeedBps  int64      `json:"speed_bps"`
	UsableBps int64      `json:"usable_bps"`
	Ports     []PortStat `json:"ports"`
	// Direction is "inbound" for the tree on the uplink's IFB (what it
	// receives towards the vNICs), "" for the uplink's own.
	Direction string `json:"direction,omitempty"`
	// NIC is the uplink device's NIC (Config.NIC); nil when not read,
	// and for an inbound tree.
	NIC *UplinkNIC `json:"nic,omitempty"`
}

// Label names the tree in metrics: the uplink, and for its inbound tree
// the uplink with "/inbound", so that a port's series of both directions
// stay apart.
func (u UplinkStat) Label() string {
	if u.Direction == "inbound" {
		return u.Uplink + "/inbound"
	}
	return u.Uplink
}

// PortStat is one class of the tree: a vNIC or a traffic class.
type PortStat struct {
	Port           string  `json:"port"`
	Class          string  `json:"class"`
	ClassID        string  `json:"classid"`
	Bytes          uint64  `json:"bytes"`
	Packets        uint64  `json:"packets"`
	Drops          uint64  `json:"drops"`
	Queued         uint64  `json:"queued"`          // packets waiting in the class's queue when read: > 0 means backlogged
	RateBps        float64 `json:"rate_bps"`        // measured, wire bits/s (smoothed)
	EntitlementBps float64 `json:"entitlement_bps"` // alloc's, payload bits/s
	GuaranteeBps   int64   `json:"htb_rate_bps"`    // HTB rate set, wire bits/s
	CeilBps        int64   `json:"htb_ceil_bps"`
	// ReservationBps, Shares and LimitBps are the port's setting in force
	// here (payload bits/s; LimitBps 0: unlimited).
	ReservationBps float64 `json:"reservation_bps"`
	Shares         float64 `json:"shares"`
	LimitBps       float64 `json:"limit_bps,omitempty"`
}

// New derives the trees of cfg.Host: the desired uplink trees of the
// policy (entitle.Derive, with the VMs the inventory says run here) and
// the inventory's devices. It touches no kernel state.
func New(cfg Config) (*Agent, error) {
	if cfg.Policy == nil || cfg.Kernel == nil || cfg.Inventory == nil {
		return nil, errors.New("agent: policy, kernel and inventory are required")
	}
	if cfg.Policy.Host(cfg.Host) == nil {
		return nil, fmt.Errorf("host %q is not in the policy", cfg.Host)
	}
	tellPolicyVMs(cfg.Inventory, cfg.Policy)
	trees, err := derive(cfg.Policy, cfg.Host, cfg.Inventory, cfg.ClassPorts)
	if err != nil {
		return nil, err
	}
	rec := &Record{Uplinks: map[string]Qdisc{}}
	if cfg.RecordPath != "" {
		if rec, err = ReadRecord(cfg.RecordPath); err != nil {
			return nil, err
		}
	}
	rec.Cluster, rec.Host = cfg.Policy.Cluster, cfg.Host
	cpu, err := deriveCPU(cfg.Policy, cfg.Host, cfg.Inventory, nil)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, trees: trees, ports: map[string]*portState{}, rec: rec, taken: map[string]bool{},
		cpuVMs: cpu, cpuGone: map[string]string{}, vnicMissing: map[string]int64{}, nicStale: true}, nil
}

// Trees returns the derived trees.
func (a *Agent) Trees() []*Tree { return a.trees }

// Stats returns the statistics of the last Step.
func (a *Agent) Stats() Stats { return a.stats }

// Measurement is what one step read from the kernel.
type Measurement struct {
	NowNs   int64
	Uplinks []UplinkReading // one per tree, in Trees order
	CPU     []CPUReading    // one per running VM of the policy (Config.Cgroups)
	// NICs are the uplinks' NICs by device, when this step read them
	// (Config.NIC: the first step, and after a change); nil otherwise.
	NICs map[string]UplinkNIC
}

// UplinkReading is one uplink's classes as read, with their counters.
type UplinkReading struct {
	Dev     string
	Classes []ClassState
	Err     error // the read failed: the uplink is left as it is this step
}

// Decision is what one control step decided, as a value that a test can
// print: per uplink the desired HTB classes and filters, and the
// statistics. Apply carries it out.
type Decision struct {
	NowNs   int64
	Uplinks []UplinkDecision
	// CPU is the desired setting of each VM cgroup (Config.Cgroups);
	// CPUErr and CPUErrs are what kept the CPU from being decided or
	// measured, for Apply to report.
	CPU []CPUAction
	// Pins is the desired pinning of every running domain of the host
	// while some VM there is latency-sensitive (Config.Pinner).
	Pins    []PinAction
	CPUErr  error
	CPUErrs []error
	Stats   Stats
}

// UplinkDecision is the desired traffic control state of one uplink.
type UplinkDecision struct {
	Dev     string
	Default uint16     // minor of the default class
	Classes []HTBClass // parents first
	Filters []Filter
	// UplinkDev is, for an inbound tree, the uplink whose ingress is
	// redirected to Dev (its IFB); "" for an uplink's own tree.
	UplinkDev string
	Err       error        // the reading failed: nothing to apply
	have      []ClassState // what was read, for Reconcile
}

// Step runs one control interval at time nowNs: Measure, Decide, Apply.
// The first Step installs the trees.
func (a *Agent) Step(nowNs int64) (Changes, error) {
	return a.Apply(a.Decide(a.Measure(nowNs)))
}

// Measure reads every tree's classes and counters from the kernel.
func (a *Agent) Measure(nowNs int64) Measurement {
	m := Measurement{NowNs: nowNs}
	for _, t := range a.trees {
		have, err := a.cfg.Kernel.Classes(t.Dev)
		if t.Inbound && err != nil && isNoDevice(err) {
			have, err = nil, nil // the IFB is created by the first Apply
		}
		if err != nil {
			err = fmt.Errorf("ClassList %s: %w", t.Dev, err)
		}
		m.Uplinks = append(m.Uplinks, UplinkReading{Dev: t.Dev, Classes: have, Err: err})
	}
	m.CPU = a.measureCPU()
	if a.nicDue(nowNs) {
		m.NICs = a.readNICs(nowNs)
	}
	return m
}

// Record returns what the agent recorded of the host before changing it.
func (a *Agent) Record() Record { return *a.rec }

// Apply reconciles every uplink to the decision and then the classifiers
// at the vNICs, collecting independent failures, and keeps the decision's
// statistics. Before its first change to an uplink it records the
// uplink's root qdisc (and refuses an Open vSwitch port).
func (a *Agent) Apply(d Decision) (Changes, error) {
	var total Changes
	var errs []error
	ready := map[string]bool{} // uplinks reconciled without error
	errs = append(errs, a.releaseUplinks(&total))
	for _, u := range d.Uplinks {
		if u.Err != nil {
			errs = append(errs, u.Err)
			continue
		}
		take := a.takeUplink
		if u.UplinkDev != "" {
			take = func(ifb string) error { return a.takeIngress(ifb, u.UplinkDev) }
		}
		if err := take(u.Dev); err != nil {
			errs = append(errs, err)
			continue
		}
		ch, err := Reconcile(a.cfg.Kernel, u.Dev, u.Default, u.Classes, u.Filters, u.have)
		if err != nil {
			errs = append(errs, err)
		} else {
			ready[u.Dev] = true
		}
		if err == nil && u.UplinkDev != "" {
			// The IFB's tree is in place: redirect the uplink's ingress.
			wrote, err := a.redirectIngress(u.Dev, u.UplinkDev)
			if wrote {
				ch.Qdisc++
			}
			errs = append(errs, err)
		}
		total.Add(ch)
	}
	// A vNIC's classifier points at its class on its uplink: it is set
	// once that uplink is in place.
	errs = append(errs, a.reconcileVNICs(d.NowNs, ready, &total))
	n, pins, err := a.applyCPUAndPins(d)
	total.CPUFiles += n
	total.CPUPins += pins
	errs = append(errs, err)
	vfs, err := a.reconcileVFs(&total)
	errs = append(errs, err)
	a.stats = a.withRoots(d.Stats)
	a.stats.VFs = vfs
	return total, errors.Join(errs...)
}

// Decide computes, from a measurement, what every uplink's classes should
// be: it estimates each port's demand from its counters, computes the
// entitlements (Tree.Entitlements) and renders the HTB classes (dynamic:
// guaranteed rates from the entitlements; static: from the policy). It
// does no I/O; it updates the agent's per-port history.
func (a *Agent) Decide(m Measurement) Decision {
	nowNs := m.NowNs
	dtNs := nowNs - a.lastNs
	first := a.lastNs == 0
	if first {
		a.startNs = nowNs
	}
	a.lastNs = nowNs
	// For the first demand window the agent only measures: it keeps the
	// rates it finds (a restart) or set when it created the tree, so that
	// it never acts on less than a window of history.
	warming := nowNs-a.startNs < DemandWindowNs
	d := Decision{NowNs: nowNs, Stats: Stats{Cluster: a.cfg.Policy.Cluster, Host: a.cfg.Host, Dynamic: a.cfg.Dynamic, NowNs: nowNs, Unnamed: a.unnamed()}}
	a.takeNICs(m.NICs)
	for i, t := range a.trees {
		r := m.Uplinks[i]
		if r.Err != nil {
			d.Uplinks = append(d.Uplinks, UplinkDecision{Dev: t.Dev, UplinkDev: t.UplinkDev, Err: r.Err})
			continue
		}
		byID := map[Handle]ClassState{}
		for _, c := range r.Classes {
			byID[c.ID] = c
		}
		demand := map[string]float64{}
		for _, n := range t.Nodes {
			ps := a.port(t, n)
			c, ok := byID[n.ID]
			if (!ok || !ps.haveLast) && (n.IsNIC || n.Declared) {
				// Not measured yet: a vNIC or a class the policy names
				// may want all it can get.
				demand[n.Name] = alloc.Inf
			}
			if !ok {
				// Created by this step: its counters start at 0. A new
				// vNIC (a VM that arrived, e.g. by migration) keeps
				// unbounded demand for its first demand window, as a
				// saturated one does: its sender, stalled by the move,
				// ramps up against neighbours that take all they get.
				ps.lastBytes, ps.haveLast = 0, true
				if n.IsNIC {
					ps.demand.saturate(nowNs)
				}
				continue
			}
			if ps.haveLast && !first && dtNs > 0 && c.Bytes >= ps.lastBytes {
				r := float64(c.Bytes-ps.lastBytes) * 8 * 1e9 / float64(dtNs)
				if ps.samples == 0 {
					ps.rateBps = r
				} else {
					ps.rateBps = rateSmoothing*r + (1-rateSmoothing)*ps.rateBps
				}
				ps.lastRateBps = r
				ps.samples++
				ps.demand.add(nowNs, r, r >= SaturatedFraction*float64(c.RateBps))
			}
			ps.lastBytes, ps.haveLast = c.Bytes, true
			if n.Leaf && !first && ps.haveLast && demand[n.Name] == 0 {
				demand[n.Name] = estimateDemand(ps, nowNs, t)
			}
		}
		// Entitlements on measured demand; static mode reports them but
		// does not apply them.
		ent := t.Entitlements(demand)
		var want []HTBClass
		if a.cfg.Dynamic {
			want = t.HTBClasses(ent)
			keepRates(want, byID, first || warming)
		} else {
			want = t.HTBClasses(nil)
		}
		ud := UplinkDecision{Dev: t.Dev, Default: t.Default, Classes: want, Filters: t.Filters, have: r.Classes}
		us := UplinkStat{Uplink: t.Uplink, Dev: t.Dev, SpeedBps: int64(t.SpeedBps), UsableBps: int64(t.UsableBps)}
		if t.Inbound {
			ud.UplinkDev, us.Direction = t.UplinkDev, "inbound"
		} else {
			us.NIC = a.uplinkNIC(t)
		}
		d.Uplinks = append(d.Uplinks, ud)
		wantBy := map[Handle]HTBClass{}
		for _, w := range want {
			wantBy[w.ID] = w
		}
		for _, n := range t.Nodes {
			ps := a.port(t, n)
			c := byID[n.ID]
			w := wantBy[n.ID]
			ps.entBps, ps.guarantee = ent[n.Name], float64(w.RateBps)
			us.Ports = append(us.Ports, PortStat{Port: n.Name, Class: n.Class, ClassID: n.ID.String(),
				Bytes: c.Bytes, Packets: c.Packets, Drops: c.Drops, Queued: c.Queued, RateBps: math.Round(ps.rateBps),
				EntitlementBps: math.Round(ent[n.Name]), GuaranteeBps: int64(w.RateBps), CeilBps: int64(w.CeilBps),
				ReservationBps: float64(n.R), Shares: n.Shares, LimitBps: finiteOr0(float64(n.L))})
		}
		sort.SliceStable(us.Ports, func(i, j int) bool { return us.Ports[i].ClassID < us.Ports[j].ClassID })
		d.Stats.Uplinks = append(d.Stats.Uplinks, us)
	}
	a.decideCPU(m, &d)
	return d
}

func (a *Agent) port(t *Tree, n *Node) *portState {
	key := t.Dev + "|" + n.Name
	ps := a.ports[key]
	if ps == nil {
		ps = &portState{}
		a.ports[key] = ps
	}
	return ps
}

// estimateDemand returns a leaf's demand in payload bits/s: unbounded when
// it used at least SaturatedFraction of its guaranteed rate in some interval
// of the last DemandWindowNs (it may want more); 0 when it is idle;
// otherwise Headroom × the most it used in that window plus HeadroomOfLine
// of the line. The window keeps a sender that is briefly short of CPU (or
// of TCP window) from losing its entitlement.
func estimateDemand(ps *portState, nowNs int64, t *Tree) float64 {
	if ps.demand.saturated(nowNs) {
		return alloc.Inf
	}
	r := max(ps.lastRateBps, ps.demand.peak())
	if r < float64(t.minRate())/2 {
		return 0 // idle: keeps the HTB floor only
	}
	return float64(t.Payload(grown(r, HeadroomOfLine*float64(t.SpeedBps))))
}

// RateDeadBand is the relative change below which dynamic enforcement leaves
// a class's guaranteed rate as it is (fewer kernel writes, steadier HTB).
const RateDeadBand = 0.01

// keepRates keeps the kernel's guaranteed rate of a class when the new one
// is within RateDeadBand of it, and during an agent's first demand window
// (too little measured, e.g. after a restart) keeps every existing class's
// rate, so that a restart does not disturb traffic.
func keepRates(want []HTBClass, have map[Handle]ClassState, first bool) {
	for i := range want {
		h, ok := have[want[i].ID]
		if !ok || h.Parent != want[i].Parent {
			continue
		}
		w := &want[i]
		d := float64(w.RateBps - h.RateBps)
		if first || (d <= RateDeadBand*float64(h.RateBps) && -d <= RateDeadBand*float64(h.RateBps)) {
			w.RateBps, w.BurstBytes = h.RateBps, h.BurstBytes
		}
	}
}

// finiteOr0 is v, or 0 when it is infinite (unlimited).
func finiteOr0(v float64) float64 {
	if math.IsInf(v, 0) {
		return 0
	}
	return v
}
