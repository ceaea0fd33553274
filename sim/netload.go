package sim

import "math"

// CPUParams model what sending costs a VM's vCPU (docs/sim.md, "CPU").
// Sending a stream costs CyclesPerByte per payload byte and
// CyclesPerPacket per GSO segment; the ACKs that come back cost
// CyclesPerAck each (one ACK per AckBytes of payload: TCP's delayed ACK,
// one per two full-sized segments), until they arrive faster than
// MaxAckRate per second, when they share one pass of the guest's stack
// (interrupt moderation, NAPI polling): above that rate the ACK path
// costs a fixed CyclesPerAck × MaxAckRate cycles/s. In steady state a
// stream of T bytes/s costs
//
//	CyclesPerByte·T + CyclesPerAck·min(T/AckBytes, MaxAckRate)
//
// cycles/s: a vCPU sends C/(CyclesPerByte + CyclesPerAck/AckBytes) below
// the knee and (C − CyclesPerAck·MaxAckRate)/CyclesPerByte above it
// (SendBps).
type CPUParams struct {
	CyclesPerByte   float64 // guest + vSwitch cycles per payload byte sent
	CyclesPerPacket float64 // per GSO segment (system call, descriptor, doorbell)
	CyclesPerAck    float64 // one pass of the guest's receive path for an ACK (0: ACKs cost nothing)
	AckBytes        float64 // payload acknowledged per ACK
	MaxAckRate      float64 // ACK passes per second at most (0: no cap)
	OverheadMHz     float64 // MHz of the vCPU the guest spends on anything but the stream
	PeakMHz         float64 // what one unlimited vCPU runs at (turbo); 0: the host's MHz
}

// DefaultCPUParams are fitted once to seed 003's whole sweep (1 vCPU,
// iperf, 4 threads; FitKnee over Seed003, with one ACK per two full-sized
// segments): 4.95 Gbps per GHz below the knee (about 1060 MHz, 5.3
// Gbps), 9.46 Gbps per GHz above 507 MHz beyond it, every limited point
// within 10% (the 400 and 600 MHz points, 5.5 and 4.5 Gbps per GHz,
// bound it); the unlimited run's 20.2 Gbps gives the clock of an
// unlimited vCPU, 2643 MHz (the E5-2670 above its 2600 MHz nominal:
// turbo). docs/sim.md, "CPU".
var DefaultCPUParams = FitKnee(Seed003, Seed003Unlimited, 2*DefaultNetParams.MSSBytes)

// SendMHz is what sending bps of payload (bits/s) costs a vCPU in steady
// state, in MHz: the stream, its segments (of segBytes) and its ACKs,
// plus OverheadMHz.
func (p CPUParams) SendMHz(bps, segBytes float64) float64 {
	bytes := bps / 8
	cycles := p.CyclesPerByte * bytes
	if segBytes > 0 {
		cycles += p.CyclesPerPacket * bytes / segBytes
	}
	if p.CyclesPerAck > 0 && p.AckBytes > 0 {
		acks := bytes / p.AckBytes
		if p.MaxAckRate > 0 {
			acks = math.Min(acks, p.MaxAckRate)
		}
		cycles += p.CyclesPerAck * acks
	}
	return p.OverheadMHz + cycles/1e6
}

// SendBps is the payload rate (bits/s) a vCPU of mhz can send in steady
// state, the inverse of SendMHz.
func (p CPUParams) SendBps(mhz, segBytes float64) float64 {
	perByte := p.CyclesPerByte
	if segBytes > 0 {
		perByte += p.CyclesPerPacket / segBytes
	}
	hz := (mhz - p.OverheadMHz) * 1e6
	if hz <= 0 || perByte+p.ackPerByte() <= 0 {
		return 0
	}
	// Below the knee every ACK costs a pass; above it the passes are capped.
	bytes := hz / (perByte + p.ackPerByte())
	if p.MaxAckRate > 0 && p.ackPerByte() > 0 && bytes/p.AckBytes > p.MaxAckRate {
		bytes = (hz - p.CyclesPerAck*p.MaxAckRate) / perByte
	}
	return bytes * 8
}

// ackPerByte is the ACK path's cycles per payload byte below the knee.
func (p CPUParams) ackPerByte() float64 {
	if p.CyclesPerAck <= 0 || p.AckBytes <= 0 {
		return 0
	}
	return p.CyclesPerAck / p.AckBytes
}

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
	// lastAckNs is when ACKs were last handled (the MaxAckRate cap).
	lastAckNs int64
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

// ack charges the vCPU for the ACKs of bytes acknowledged now: one pass
// per AckBytes, but no more passes than MaxAckRate allows since the last
// ACKs (the rest share a pass). The work occupies the vCPU: a segment
// sent later waits for it.
func (c *vcpu) ack(bytes int64) {
	if c == nil || c.p.CyclesPerAck <= 0 || c.p.AckBytes <= 0 {
		return
	}
	now := c.eng.NowNs()
	passes := float64(bytes) / c.p.AckBytes
	if c.p.MaxAckRate > 0 {
		passes = math.Min(passes, c.p.MaxAckRate*float64(now-c.lastAckNs)/1e9)
	}
	c.lastAckNs = now
	cycles := passes * c.p.CyclesPerAck
	if cycles <= 0 {
		return
	}
	if c.busy != nil {
		c.busy.add(cycles, 0)
	}
	c.freeNs = max(c.freeNs, now) + int64(cycles/c.hz*1e9)
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
			st.cpu.ack(b)
			st.onDone()
			st.onDone = nil
			return
		}
		// The segment the ACKs release is handed over first and their
		// work occupies the vCPU after it (pipelined, as a send is): at
		// this granularity one event stands for the ~22 ACKs of a 64 KiB
		// segment, which the guest handles as they come.
		st.pump()
		st.cpu.ack(b)
	})
}

// rr is a request/response workload served by a VM: users each start an
// operation, a run of exchanges one after the other: a request arrives
// after half the base RTT, the VM works serverNs and answers with
// respBytes through its port, which reach the client after the other
// half; the next request follows at once. The operation's response time
// is measured at the client (from its first request to the last byte of
// its last response); then the user thinks (exponential, mean thinkNs; 0
// for netperf TCP_RR). This is a closed queueing model: the users, their
// think time, and per exchange the VM's work and its response's wait in
// the port's queue under the uplink's scheduler.
type rr struct {
	s         *Sim
	portName  string
	cpu       *vcpu
	respBytes int64 // per exchange
	serverNs  int64 // per exchange
	thinkNs   int64
	exchanges int // per operation (≥ 1)
	active    bool
	series    *Series
}

type rrReq struct {
	w     *rr
	t0    int64 // the operation's start
	bytes int64
	left  int64 // bytes of the response not yet sent
	more  int   // exchanges of the operation after this one
}

func (q *rrReq) sent(nowNs int64, b int64) {
	w := q.w
	q.left -= b
	if q.left > 0 {
		return
	}
	w.s.eng.After(w.s.net.BaseRTTNs/2, func() {
		if q.more > 0 {
			w.exchange(q.t0, q.more-1)
			return
		}
		w.series.add(float64(w.s.eng.NowNs()-q.t0)/1e3, 1)
		w.user()
	})
}

// user starts one user's next operation after its think time.
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
		w.exchange(w.s.eng.NowNs(), max(w.exchanges, 1)-1)
	})
}

// exchange sends one request of an operation that started at t0; more
// exchanges follow it.
func (w *rr) exchange(t0 int64, more int) {
	if !w.active {
		return
	}
	q := &rrReq{w: w, t0: t0, bytes: w.respBytes, left: w.respBytes, more: more}
	w.s.eng.After(w.s.net.BaseRTTNs/2+w.serverNs, func() {
		pkts := (q.bytes + w.s.net.MSSBytes - 1) / w.s.net.MSSBytes
		w.cpu.run(q.bytes, pkts, func() {
			// The response leaves in segments of at most SegmentBytes.
			for off := int64(0); off < q.bytes; off += w.s.net.SegmentBytes {
				w.push(q, min(w.s.net.SegmentBytes, q.bytes-off))
			}
		})
	})
}

func (w *rr) push(q *rrReq, b int64) {
	pt := w.s.ports[w.portName]
	if !pt.enqueue(b, q) {
		pt.wait(func() { w.push(q, b) })
	}
}
