package sim

import (
	"math"
)

// NetParams are the parameters of the network models. Defaults
// (DefaultNetParams) and where they come from are in docs/sim.md.
type NetParams struct {
	SegmentBytes int64 // GSO segment the models move as one unit (64 KiB)
	MSSBytes     int64 // TCP payload per wire packet (1448: 1500 MTU − IP/TCP headers with timestamps)
	WireOverhead int64 // bytes on the wire per packet beyond the payload (90: TCP/IP 52 + Ethernet 18 + preamble 8 + gap 12)
	BaseRTTNs    int64 // round trip outside the uplink queue (switch, receiver, ack)
	PortQueue    int   // segments a port may hold in the uplink's queue before its senders block
}

// DefaultNetParams: 10 GbE carries 1448/1538 = 94.1% payload = 9.41 Gbps.
var DefaultNetParams = NetParams{SegmentBytes: 64 << 10, MSSBytes: 1448, WireOverhead: 90, BaseRTTNs: 50_000, PortQueue: 64}

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
	class   int
	queue   []segment
	qhead   int
	waiters []func() // senders blocked on a full queue
	// SentBytes counts payload bytes sent since the last sample.
	series *Series
}

// Uplink is one physical NIC of a host with one transmit queue.
type Uplink struct {
	Name     string
	Host     string
	LineBps  float64
	UsableBp float64
	p        NetParams
	eng      *Engine
	sched    TxScheduler
	ioc      *netiocSched // nil for the default scheduler
	ports    []*Port
	busy     bool
	wakeAtNs int64
	failed   bool
}

func newUplink(eng *Engine, host, name string, lineBps, usableBps float64, p NetParams, scheduler string, classes []schedClass) *Uplink {
	u := &Uplink{Name: name, Host: host, LineBps: lineBps, UsableBp: usableBps, p: p, eng: eng}
	if scheduler == "default" {
		u.sched = &fifoSched{}
	} else {
		u.ioc = &netiocSched{capacity: usableBps, classes: append([]schedClass(nil), classes...), dirty: true}
		u.sched = u.ioc
	}
	return u
}

// addPort attaches a port with its class index and R/S/L.
func (u *Uplink) addPort(pt *Port, class int, res, shares, limit float64) {
	pt.id = len(u.ports)
	pt.up = u
	pt.class = class
	u.ports = append(u.ports, pt)
	if u.ioc != nil {
		u.ioc.ports = append(u.ioc.ports, &schedPort{class: class, res: res, shares: shares, limit: limit})
		u.ioc.dirty = true
	}
}

// setPort changes a port's R/S/L or activity.
func (u *Uplink) setPort(pt *Port, res, shares, limit float64, active bool) {
	if u.ioc == nil {
		return
	}
	sp := u.ioc.ports[pt.id]
	sp.res, sp.shares, sp.limit, sp.active = res, shares, limit, active
	u.ioc.dirty = true
}

// entitlement is the port's current entitlement in bps (0 under FIFO).
func (u *Uplink) entitlement(pt *Port) float64 {
	if u.ioc == nil {
		return 0
	}
	if u.ioc.dirty {
		u.ioc.recompute()
	}
	return u.ioc.ports[pt.id].weight
}

// enqueue queues a segment on pt; it returns false (and queues nothing)
// when the port's queue is full: the sender must wait (see wait).
func (pt *Port) enqueue(bytes int64, src sender) bool {
	if len(pt.queue)-pt.qhead >= pt.up.p.PortQueue {
		return false
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
			u.eng.At(next, u.kick)
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
	txNs := int64(math.Ceil(float64(u.p.wireBits(seg.bytes)) / u.LineBps * 1e9))
	u.eng.After(txNs, func() {
		u.busy = false
		if pt.series != nil {
			pt.series.add(float64(seg.bytes*8), 1)
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
	})
}
