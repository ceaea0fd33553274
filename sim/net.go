package sim

import (
	"fmt"
	"math"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/hclock"
	"sluice/policy"
)

// NetParams are the parameters of the network models. Defaults
// (DefaultNetParams) and where they come from are in docs/sim.md.
type NetParams struct {
	SegmentBytes int64 // GSO segment the models move as one unit (64 KiB)
	MSSBytes     int64 // TCP payload per wire packet (1448: 1500 MTU − IP/TCP headers with timestamps)
	WireOverhead int64 // bytes on the wire per packet beyond the payload (90: TCP/IP 52 + Ethernet 18 + preamble 8 + gap 12)
	BaseRTTNs    int64 // round trip outside the uplink queue (switch, receiver, ack)
	PortQueue    int   // segments a port may hold in the uplink's queue before its senders block
	// IRQCoalesceNs is the guest's transmit-completion interrupt
	// coalescing window: completions within it share one interrupt
	// (seed 000: the default guest interrupt rate is 4000/s → 250 µs).
	IRQCoalesceNs int64
	// CyclesPerIRQ is what one guest interrupt costs the VM's vCPU
	// (exit, handler, re-entry); an assumption, see docs/sim.md.
	CyclesPerIRQ float64
	// SchedNsPerSegment is the CPU time the NetIOC scheduler spends per
	// segment it schedules: package hclock's measured Enqueue+Dequeue
	// (docs/perf/hclock.md: ~150 ns with 100 ports).
	SchedNsPerSegment float64
}

// DefaultNetParams: 10 GbE carries 1448/1538 = 94.1% payload = 9.41 Gbps.
var DefaultNetParams = NetParams{SegmentBytes: 64 << 10, MSSBytes: 1448, WireOverhead: 90, BaseRTTNs: 50_000, PortQueue: 64,
	IRQCoalesceNs: 250_000, CyclesPerIRQ: 10_000, SchedNsPerSegment: 150}

// wireBits is the number of bits a payload of b bytes takes on the wire.
func (p NetParams) wireBits(b int64) int64 {
	pkts := (b + p.MSSBytes - 1) / p.MSSBytes
	return (b + pkts*p.WireOverhead) * 8
}

// segment is one unit of transmission queued on a port.
type segment struct {
	bytes int64
	src   sender
}

// sender is told when its segment has left the uplink.
type sender interface {
	sent(nowNs int64, bytes int64)
}

// Port is a network endpoint sending through an uplink: a vNIC (VM/NIC) or
// a system class on a host (HOST/CLASS).
type Port struct {
	Name    string
	id      int
	up      *Uplink
	class   string // the traffic class: "vm" for vNICs
	queue   []segment
	qhead   int
	waiters []func() // senders blocked on a full queue
	vcpu    *vcpu    // the VM's vCPU (nil for system classes): completion interrupts
	// SentBytes counts payload bytes sent since the last sample.
	series *Series
}

// Uplink is one physical NIC of a host with one transmit queue, drained
// at line rate; the scheduler is package hclock (NetIOC) or a FIFO (the
// seeds' "default scheduler").
type Uplink struct {
	Name     string
	Host     string
	LineBps  float64
	p        NetParams
	eng      *Engine
	sched    TxScheduler
	hc       *hclock.Scheduler // nil for the default scheduler
	ids      map[string]int    // port or class name → scheduler node ID
	ports    []*Port           // by node ID
	busy     bool
	wakeAtNs int64
	failed   bool
	schedCPU *Series      // CPU the scheduler spends (hclock only)
	series   *Series      // payload bits sent
	cpuHz    float64      // host core clock, to turn scheduler time into cycles
	tree     *entitle.Net // the uplink's tree in the last derivation (Sim.resync)
	// prefix names the uplink's ports: "" for what it sends, InPrefix
	// for the model of what it receives (its ports are InPrefix+VM/NIC).
	prefix  string
	entAtNs int64 // entitlements cached at this time
	ent     map[string]float64
	// The segment on the wire (busy), and kick and txDone as func values
	// made once: scheduling them allocates nothing.
	txPort           *Port
	txSeg            segment
	kickFn, txDoneFn func()
}

// InPrefix names a port of the model of what an uplink receives: the
// inbound side of vNIC vm1/nic0 is port (and series) "in:vm1/nic0".
const InPrefix = "in:"

// hclockSched adapts package hclock to TxScheduler.
type hclockSched struct{ h *hclock.Scheduler }

func (a hclockSched) Enqueue(port int, bytes int64, nowNs int64) {
	a.h.Enqueue(port, int(bytes), nowNs)
}

func (a hclockSched) Dequeue(nowNs int64) (int, bool, int64) {
	pkt, ok, next := a.h.Dequeue(nowNs)
	if next == hclock.Never {
		next = 0
	}
	return pkt.Port, ok, next
}

// newUplink builds an uplink. Under NetIOC the hclock tree is uplink →
// every traffic class → one port per system class and one per scheduled
// (not passthrough) vNIC of the cluster (a VM can migrate here), so that
// the tree never changes; Sim.resync sets the parameters the derivation
// gives.
//
// With inbound it builds the model of what the uplink receives towards
// the host's vNICs (issue 27): the same scheduler on the inbound tree of
// the derivation (the classes' and vNICs' ingress settings; only vNICs
// with ingress), its ports named InPrefix+VM/NIC; the fabric's senders
// feed it.
func newUplink(eng *Engine, host, name string, lineBps float64, p NetParams, scheduler string, pol *policy.Policy, inbound bool) (*Uplink, error) {
	u := &Uplink{Name: name, Host: host, LineBps: lineBps, p: p, eng: eng, ids: map[string]int{}}
	u.kickFn, u.txDoneFn = u.kick, u.txDone
	if inbound {
		u.prefix = InPrefix
	}
	if scheduler == "default" {
		u.sched = &fifoSched{}
		return u, nil
	}
	cfg := hclock.Config{Nodes: []hclock.NodeConfig{{ID: 0, Parent: -1, Name: host + "/" + name, Params: hclock.Params{Shares: 1}}}}
	add := func(parent int, name string, prm hclock.Params) int {
		id := len(cfg.Nodes)
		if prm.Shares <= 0 {
			prm.Shares = 1
		}
		cfg.Nodes = append(cfg.Nodes, hclock.NodeConfig{ID: id, Parent: parent, Name: name, Params: prm, QueuePackets: 4 * p.PortQueue})
		u.ids[name] = id
		return id
	}
	for _, c := range pol.TrafficClasses {
		cp := hclock.Params{ReservationBps: float64(c.Reservation), Shares: float64(c.Shares), LimitBps: entitle.RateLimit(c.Limit)}
		if inbound {
			cp = hclock.Params{Shares: policy.NetSharesNormal, LimitBps: alloc.Inf} // resync sets the derivation's
		}
		cid := add(0, "class:"+c.Name, cp)
		if c.Name == "vm" {
			for _, vm := range pol.VMs {
				for _, n := range vm.NICs {
					if n.Passthrough || inbound && n.Ingress == nil {
						continue
					}
					np := hclock.Params{ReservationBps: float64(n.Reservation), Shares: float64(n.Shares), LimitBps: entitle.RateLimit(n.Limit)}
					if inbound {
						np = hclock.Params{ReservationBps: float64(n.Ingress.Reservation), Shares: float64(n.Ingress.Shares), LimitBps: entitle.RateLimit(n.Ingress.Limit)}
					}
					add(cid, u.prefix+policy.PortName(vm.Name, n.Name), np)
				}
			}
		} else {
			add(cid, u.prefix+policy.ClassName(host, c.Name), hclock.Params{Shares: 1})
		}
	}
	h, err := hclock.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("uplink %s/%s: %v", host, name, err)
	}
	u.hc = h
	u.sched = hclockSched{h}
	return u, nil
}

// addPort attaches a port (VM/NIC or HOST/CLASS).
func (u *Uplink) addPort(pt *Port) error {
	pt.up = u
	if u.hc == nil {
		pt.id = len(u.ports)
		u.ports = append(u.ports, pt)
		return nil
	}
	id, ok := u.ids[pt.Name]
	if !ok {
		return fmt.Errorf("no port %s on uplink %s/%s", pt.Name, u.Host, u.Name)
	}
	pt.id = id
	for len(u.ports) <= id {
		u.ports = append(u.ports, nil)
	}
	u.ports[id] = pt
	return nil
}

// setParams makes the R/S/L of a port or of a class ("class:NAME") in
// hclock what is given (bits/s; limit alloc.Inf when unlimited); it
// changes nothing when they already are.
func (u *Uplink) setParams(name string, res, shares, limit float64) error {
	if u.hc == nil {
		return nil
	}
	id, ok := u.ids[name]
	if !ok {
		return fmt.Errorf("uplink %s/%s: no scheduler node %s", u.Host, u.Name, name)
	}
	if shares <= 0 {
		shares = 1
	}
	p := hclock.Params{ReservationBps: res, Shares: shares, LimitBps: limit}
	if u.hc.Params(id) == p {
		return nil
	}
	if err := u.hc.SetParams(id, p, u.eng.NowNs()); err != nil {
		return fmt.Errorf("uplink %s/%s: SetParams %s: %w", u.Host, u.Name, name, err)
	}
	return nil
}

// enqueue queues a segment on pt; it returns false (and queues nothing)
// when the port's queue is full: the sender must wait (see wait).
func (pt *Port) enqueue(bytes int64, src sender) bool {
	if len(pt.queue)-pt.qhead >= pt.up.p.PortQueue {
		return false
	}
	if pt.qhead > 0 && len(pt.queue) == cap(pt.queue) {
		// Reuse the slots already sent instead of growing the array.
		n := copy(pt.queue, pt.queue[pt.qhead:])
		clear(pt.queue[n:])
		pt.queue, pt.qhead = pt.queue[:n], 0
	}
	pt.queue = append(pt.queue, segment{bytes, src})
	u := pt.up
	u.sched.Enqueue(pt.id, bytes, u.eng.NowNs())
	u.kick()
	return true
}

// wait registers fn to run once the port's queue has room again.
func (pt *Port) wait(fn func()) { pt.waiters = append(pt.waiters, fn) }

func (u *Uplink) kick() {
	if u.busy || u.failed {
		return
	}
	now := u.eng.NowNs()
	id, ok, next := u.sched.Dequeue(now)
	if !ok {
		if next > now && (u.wakeAtNs <= now || next < u.wakeAtNs) {
			u.wakeAtNs = next
			u.eng.At(next, u.kickFn)
		}
		return
	}
	pt := u.ports[id]
	seg := pt.queue[pt.qhead]
	pt.queue[pt.qhead] = segment{}
	pt.qhead++
	if pt.qhead == len(pt.queue) {
		pt.queue, pt.qhead = pt.queue[:0], 0
	}
	u.busy = true
	if u.hc != nil && u.schedCPU != nil {
		u.schedCPU.add(u.p.SchedNsPerSegment*1e-9*u.cpuHz, 0)
	}
	txNs := int64(math.Ceil(float64(u.p.wireBits(seg.bytes)) / u.LineBps * 1e9))
	u.txPort, u.txSeg = pt, seg
	u.eng.After(txNs, u.txDoneFn)
}

// txDone ends the transmission kick started: the segment is counted, its
// sender told, a blocked sender woken, and the next segment started.
func (u *Uplink) txDone() {
	pt, seg := u.txPort, u.txSeg
	u.txPort, u.txSeg = nil, segment{}
	u.busy = false
	if pt.series != nil {
		pt.series.add(float64(seg.bytes*8), 1)
	}
	if u.series != nil {
		u.series.add(float64(seg.bytes*8), 1)
	}
	if pt.vcpu != nil {
		pt.vcpu.txDone()
	}
	if seg.src != nil {
		seg.src.sent(u.eng.NowNs(), seg.bytes)
	}
	if len(pt.waiters) > 0 {
		w := pt.waiters[0]
		pt.waiters = pt.waiters[1:]
		w()
	}
	u.kick()
}
