package sim

import "math"

// CPUParams model what sending costs a VM's vCPU (docs/sim.md).
type CPUParams struct {
	CyclesPerByte   float64 // guest + vSwitch cycles per payload byte sent
	CyclesPerPacket float64 // per GSO segment (system call, descriptor, doorbell)
	OverheadMHz     float64 // MHz of the vCPU the guest spends on anything but the stream
	PeakMHz         float64 // what one unlimited vCPU runs at (turbo); 0: the host's MHz
}

// DefaultCPUParams are fitted once to seed 003's sweep (1 vCPU, iperf, 4
// threads): 2600 MHz → 19.2 Gbps and 400 MHz → 2.2 Gbps give 7.73 Gbps per
// GHz above an overhead of 115 MHz, and the unlimited run's 20.2 Gbps gives
// the turbo clock of 2730 MHz.
var DefaultCPUParams = CPUParams{CyclesPerByte: 8 / 7.727, CyclesPerPacket: 0, OverheadMHz: 115, PeakMHz: 2730}

// vcpu is one VM's processor as a single server of send work.
type vcpu struct {
	eng       *Engine
	p         CPUParams
	hz        float64 // cycles/s available to the stream
	irqNs     int64
	irqCycles float64
	freeNs    int64
	busy      *Series // cycles used (for CPU cost)
	// irqUntilNs ends the current interrupt coalescing window.
	irqUntilNs int64
	irqs       *Series
}

// txDone accounts a transmit completion: it raises a guest interrupt
// unless one is already pending in the coalescing window.
func (c *vcpu) txDone() {
	now := c.eng.NowNs()
	if now < c.irqUntilNs {
		return
	}
	c.irqUntilNs = now + c.irqNs
	if c.busy != nil {
		c.busy.add(c.irqCycles, 0)
	}
	if c.irqs != nil {
		c.irqs.add(1, 1)
	}
}

func (c *vcpu) setMHz(mhz float64) {
	c.hz = math.Max(mhz-c.p.OverheadMHz, 1) * 1e6
}

// run charges the cost of sending bytes and calls fn when done.
func (c *vcpu) run(bytes int64, pkts int64, fn func()) {
	if c == nil {
		fn()
		return
	}
	cycles := c.p.CyclesPerByte*float64(bytes) + c.p.CyclesPerPacket*float64(pkts)
	now := c.eng.NowNs()
	if c.busy != nil {
		c.busy.add(cycles, 0)
	}
	if c.freeNs <= now {
		// An idle vCPU hands the segment over at once and works on it
		// while it is queued (the send is pipelined); it is busy until
		// the work is done, so the next segment waits for it.
		c.freeNs = now + int64(cycles/c.hz*1e9)
		fn()
		return
	}
	c.freeNs += int64(cycles / c.hz * 1e9)
	c.eng.At(c.freeNs, fn)
}

// stream is one TCP-stream-like sender: it keeps at most window bytes
// unacknowledged, moves SegmentBytes at a time, blocks when its port's
// queue is full, and (for vMotion-like transfers) sends at most rateBps and
// stops after total bytes.
type stream struct {
	s         *Sim
	port      *Port
	portName  string
	cpu       *vcpu
	window    int64
	inflight  int64
	remaining int64 // bytes left to send; <0: endless
	rateBps   float64
	nextNs    int64
	active    bool
	pumping   bool
	onDone    func()
}

func (st *stream) start() {
	st.active = true
	st.pump()
}

func (st *stream) pump() {
	if st.pumping {
		return
	}
	st.pumping = true
	defer func() { st.pumping = false }()
	seg := st.s.net.SegmentBytes
	for st.active && st.inflight+seg <= st.window && st.remaining != 0 {
		now := st.s.eng.NowNs()
		if st.rateBps > 0 && st.nextNs > now {
			st.s.eng.At(st.nextNs, st.pump)
			return
		}
		b := seg
		if st.remaining > 0 {
			b = min(b, st.remaining)
			st.remaining -= b
		}
		if st.rateBps > 0 {
			st.nextNs = max(now, st.nextNs) + int64(float64(b*8)/st.rateBps*1e9)
		}
		st.inflight += b
		pkts := (b + st.s.net.MSSBytes - 1) / st.s.net.MSSBytes
		st.cpu.run(b, pkts, func() { st.push(b) })
	}
}

func (st *stream) push(b int64) {
	pt := st.s.ports[st.portName]
	if !pt.enqueue(b, st) {
		pt.wait(func() { st.push(b) })
	}
}

func (st *stream) sent(_ int64, b int64) {
	st.s.eng.After(st.s.net.BaseRTTNs, func() {
		st.inflight -= b
		if st.remaining == 0 && st.inflight == 0 && st.onDone != nil {
			st.active = false
			st.onDone()
			st.onDone = nil
			return
		}
		st.pump()
	})
}

// rr is a request/response workload served by a VM: users each send a
// request (arriving after half the base RTT), the VM works serverNs and
// answers with respBytes through its port; the response time is measured
// at the client. thinkNs separates a user's requests (0 for netperf TCP_RR).
type rr struct {
	s         *Sim
	portName  string
	cpu       *vcpu
	respBytes int64
	serverNs  int64
	thinkNs   int64
	active    bool
	series    *Series
}

type rrReq struct {
	w     *rr
	t0    int64
	bytes int64
	left  int64 // bytes of the response not yet sent
}

func (q *rrReq) sent(nowNs int64, b int64) {
	w := q.w
	q.left -= b
	if q.left > 0 {
		return
	}
	w.s.eng.After(w.s.net.BaseRTTNs/2, func() {
		w.series.add(float64(w.s.eng.NowNs()-q.t0)/1e3, 1)
		w.user()
	})
}

// user starts one user's next request after its think time.
func (w *rr) user() {
	if !w.active {
		return
	}
	think := int64(0)
	if w.thinkNs > 0 {
		think = int64(w.s.eng.Rand.ExpFloat64() * float64(w.thinkNs))
	}
	w.s.eng.After(think, func() {
		if !w.active {
			return
		}
		q := &rrReq{w: w, t0: w.s.eng.NowNs(), bytes: w.respBytes, left: w.respBytes}
		w.s.eng.After(w.s.net.BaseRTTNs/2+w.serverNs, func() {
			pkts := (q.bytes + w.s.net.MSSBytes - 1) / w.s.net.MSSBytes
			w.cpu.run(q.bytes, pkts, func() {
				// The response leaves in segments of at most SegmentBytes.
				for off := int64(0); off < q.bytes; off += w.s.net.SegmentBytes {
					w.push(q, min(w.s.net.SegmentBytes, q.bytes-off))
				}
			})
		})
	})
}

func (w *rr) push(q *rrReq, b int64) {
	pt := w.s.ports[w.portName]
	if !pt.enqueue(b, q) {
		pt.wait(func() { w.push(q, b) })
	}
}
