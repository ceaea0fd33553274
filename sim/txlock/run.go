package txlock

import (
	"math"
	"math/rand/v2"
)

type evKind uint8

const (
	evArrive   evKind = iota // a CPU reaches its qdisc's lock with an skb
	evEnqueue                // the skb is in the qdisc; the CPU is free
	evVMWake                 // a VM may send again (its idle time or pacing ended)
	evLinkDone               // the link finished an skb
	evLinkWake               // the link looks for an eligible skb again
	evTick                   // the agent's interval
)

type event struct {
	atNs int64
	seq  uint64
	kind evKind
	a, b int32 // CPU and VM, or VM for evLinkDone
}

// eventHeap is a binary min-heap by (time, order of scheduling).
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].atNs != h[j].atNs {
		return h[i].atNs < h[j].atNs
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s.less(l, m) {
			m = l
		}
		if r := l + 1; r < n && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

type cpuState struct {
	busy   bool
	idle   bool // on the run's stack of idle CPUs
	busyNs float64
	spinNs float64
}

type lockState struct {
	freeNs int64
	last   int // CPU that held it last, -1 at first
	busyNs float64
	spinNs float64
}

type run struct {
	cfg    Config
	c      Costs
	now    int64
	seq    uint64
	h      eventHeap
	rng    *rand.Rand
	events uint64

	vms    []vmState
	cpus   []cpuState
	locks  []lockState
	queues []*queue
	agent  agent

	idleCPUs   []int // CPUs with nothing to send
	ready      []int // VMs that may send, in the order CPUs take them (round robin)
	readyHead  int
	linkBusy   bool
	linkWakeAt int64
	linkRR     int
	linkBits   float64 // bits sent in the window
	linkSkbs   float64
	samples    []Sample
}

func (r *run) at(t int64, k evKind, a, b int) {
	r.seq++
	r.h.push(event{atNs: t, seq: r.seq, kind: k, a: int32(a), b: int32(b)})
}

func (r *run) inWindow() bool { return r.now >= r.cfg.WindowFromNs }

// Run simulates cfg and returns its result. It panics on a config without
// VMs, CPUs or a link rate (a broken caller, not an input to report).
func Run(cfg Config) Result {
	r := newRun(cfg)
	r.loop()
	return r.result()
}

func newRun(cfg Config) *run {
	cfg = withDefaults(cfg)
	r := &run{cfg: cfg, c: cfg.Costs, rng: rand.New(rand.NewPCG(cfg.Seed, 0x7e1c)), linkWakeAt: -1}
	r.setup()
	return r
}

func (r *run) loop() {
	cfg := r.cfg
	for len(r.h) > 0 {
		e := r.h.pop()
		if e.atNs >= cfg.DurationNs {
			break
		}
		r.now = e.atNs
		r.events++
		switch e.kind {
		case evArrive:
			r.arrive(int(e.a), int(e.b))
		case evEnqueue:
			r.enqueue(int(e.a), int(e.b))
		case evVMWake:
			r.vms[e.b].timed = false
			r.makeReady(int(e.b))
		case evLinkDone:
			r.linkDone(int(e.b))
		case evLinkWake:
			if r.linkWakeAt == e.atNs {
				r.linkWakeAt = -1
			}
			r.linkTry()
		case evTick:
			r.tick()
			r.at(r.now+cfg.IntervalNs, evTick, 0, 0)
		}
	}
}

func withDefaults(cfg Config) Config {
	if cfg.CPUs <= 0 || cfg.LinkBps <= 0 || len(cfg.VMs) == 0 {
		panic("txlock: a run needs CPUs, a link rate and VMs")
	}
	if cfg.Queues <= 0 {
		cfg.Queues = cfg.CPUs
	}
	if cfg.Form == FormSingleHTB {
		cfg.Queues = 1
	}
	if cfg.IntervalNs <= 0 {
		cfg.IntervalNs = 100_000_000
	}
	if cfg.DurationNs <= 0 {
		cfg.DurationNs = 300_000_000
	}
	if cfg.QueueCapBytes <= 0 {
		cfg.QueueCapBytes = 2 << 20
	}
	vms := make([]VM, len(cfg.VMs))
	copy(vms, cfg.VMs)
	for i := range vms {
		if vms[i].Segs <= 0 {
			vms[i].Segs = 1
		}
		if vms[i].DemandBps <= 0 {
			vms[i].DemandBps = math.Inf(1)
		}
	}
	cfg.VMs = vms
	return cfg
}

func (r *run) setup() {
	cfg := r.cfg
	r.cpus = make([]cpuState, cfg.CPUs)
	r.queues = make([]*queue, cfg.Queues)
	for i := range r.queues {
		r.queues[i] = &queue{form: cfg.Form}
	}
	nlocks := cfg.Queues
	r.locks = make([]lockState, nlocks)
	for i := range r.locks {
		r.locks[i].last = -1
	}
	assign := assignQueues(cfg)
	r.vms = make([]vmState, len(cfg.VMs))
	for i, v := range cfg.VMs {
		s := &r.vms[i]
		s.VM = v
		s.queue = assign[i]
		s.bits = WireBits(v.Segs)
		s.bytes = int64(v.Segs * segWireBytes)
		s.weight = v.Shares
		if s.weight <= 0 {
			s.weight = 1
		}
		if cfg.Form != FormEDTFQ {
			q := r.queues[s.queue]
			q.vms = append(q.vms, i)
			q.maxSkbBits = max(q.maxSkbBits, s.bits)
		}
	}
	r.agent.init(r)
	r.agent.set(r, nil)
	for i := range r.vms {
		r.vms[i].inReady = true
		r.ready = append(r.ready, i)
	}
	for c := range r.cpus {
		r.cpuTry(c)
	}
	r.at(cfg.IntervalNs, evTick, 0, 0)
}

// assignQueues gives each VM its TX queue: 0 for the single tree, -1 for
// EDT (an skb takes its sending CPU's queue, XPS), and for per-queue HTB
// the agent's choice: largest reservation first, each to the queue holding
// the least reservation (then the fewest VMs).
func assignQueues(cfg Config) []int {
	q := make([]int, len(cfg.VMs))
	switch cfg.Form {
	case FormSingleHTB:
		return q
	case FormEDTFQ:
		for i := range q {
			q[i] = -1
		}
		return q
	}
	order := make([]int, len(cfg.VMs))
	for i := range order {
		order[i] = i
	}
	// Insertion sort by reservation, descending; stable by index.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && cfg.VMs[order[j]].ReservationBps > cfg.VMs[order[j-1]].ReservationBps; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	res := make([]float64, cfg.Queues)
	n := make([]int, cfg.Queues)
	for _, i := range order {
		best := 0
		for k := 1; k < cfg.Queues; k++ {
			if res[k] < res[best] || (res[k] == res[best] && n[k] < n[best]) {
				best = k
			}
		}
		q[i] = best
		res[best] += cfg.VMs[i].ReservationBps
		n[best]++
	}
	return q
}

func (r *run) idle(v *vmState) bool {
	return v.IdleToNs > v.IdleFromNs && r.now >= v.IdleFromNs && r.now < v.IdleToNs
}

// queueOf is the TX queue (and lock) of VM i's skb sent from CPU c.
func (r *run) queueOf(c, i int) int {
	if r.cfg.Form == FormEDTFQ {
		return c % r.cfg.Queues
	}
	return r.vms[i].queue
}

// makeReady puts VM i at the tail of the ready VMs and wakes an idle CPU.
func (r *run) makeReady(i int) {
	v := &r.vms[i]
	if v.inReady || v.timed {
		return
	}
	v.inReady = true
	r.ready = append(r.ready, i)
	for n := len(r.idleCPUs); n > 0; n = len(r.idleCPUs) {
		c := r.idleCPUs[n-1]
		r.idleCPUs = r.idleCPUs[:n-1]
		r.cpus[c].idle = false
		if !r.cpus[c].busy {
			r.cpuTry(c)
			return
		}
	}
}

// cpuTry starts the CPU's next skb for the VM at the head of the ready
// VMs, which then goes to the tail: every CPU sends for every VM, round
// robin, as a guest's virtio queues and vhost threads spread over the
// host's CPUs. A VM that may not send leaves the ready VMs until it may:
// its queue full (until the link sends one of its skbs), idle or paced
// (until an evVMWake).
func (r *run) cpuTry(c int) {
	cpu := &r.cpus[c]
	if cpu.busy {
		return
	}
	for r.readyHead < len(r.ready) {
		i := r.ready[r.readyHead]
		r.readyHead++
		if r.readyHead > 1024 && r.readyHead*2 > len(r.ready) {
			r.ready = append(r.ready[:0], r.ready[r.readyHead:]...)
			r.readyHead = 0
		}
		v := &r.vms[i]
		v.inReady = false
		switch {
		case r.idle(v):
			v.timed = true
			r.at(v.IdleToNs, evVMWake, 0, i)
			continue
		case v.inflight+v.bytes > r.cfg.QueueCapBytes && v.inflight > 0:
			v.full = true
			continue
		case v.nextGenNs > float64(r.now):
			v.timed = true
			r.at(int64(math.Ceil(v.nextGenNs)), evVMWake, 0, i)
			continue
		}
		v.inflight += v.bytes
		if !math.IsInf(v.DemandBps, 1) {
			// Poisson offers: a VM's many flows are not in step.
			v.nextGenNs = math.Max(v.nextGenNs, float64(r.now)) + r.rng.ExpFloat64()*v.bits/v.DemandBps*1e9
		}
		v.inReady = true
		r.ready = append(r.ready, i)
		cost := r.c.stack(v.Segs) * (1 + r.c.Jitter*(2*r.rng.Float64()-1))
		if r.cfg.Form != FormSingleHTB {
			cost += r.c.ProgNs
		}
		if r.inWindow() {
			cpu.busyNs += cost
		}
		cpu.busy = true
		r.at(r.now+int64(math.Round(cost)), evArrive, c, i)
		return
	}
	if !cpu.idle {
		cpu.idle = true
		r.idleCPUs = append(r.idleCPUs, c)
	}
}

// arrive queues the CPU at the lock of the skb's qdisc (FIFO, spinning).
func (r *run) arrive(c, i int) {
	v := &r.vms[i]
	lk := &r.locks[r.queueOf(c, i)]
	grant := max(r.now, lk.freeNs)
	var hold float64
	if r.cfg.Form == FormEDTFQ {
		hold = r.c.fq(v.Segs)
	} else {
		hold = r.c.htb(v.Segs)
	}
	if lk.last >= 0 && lk.last != c {
		hold += r.c.HandoffNs
	}
	h := int64(math.Round(hold))
	lk.freeNs = grant + h
	lk.last = c
	if r.inWindow() {
		cpu := &r.cpus[c]
		spin := float64(grant - r.now)
		cpu.spinNs += spin
		lk.spinNs += spin
		cpu.busyNs += spin + float64(h)
		lk.busyNs += float64(h)
	}
	r.at(grant+h, evEnqueue, c, i)
}

func (r *run) enqueue(c, i int) {
	r.queues[r.queueOf(c, i)].push(r, i)
	r.cpus[c].busy = false
	r.cpuTry(c)
	r.linkTry()
}

// linkTry starts the next skb on an idle link: the queues round robin, each
// by its discipline.
func (r *run) linkTry() {
	if r.linkBusy {
		return
	}
	next := int64(math.MaxInt64)
	nq := len(r.queues)
	for k := 0; k < nq; k++ {
		qi := (r.linkRR + k) % nq
		i, wait := r.queues[qi].pop(r)
		if i < 0 {
			if wait > 0 {
				next = min(next, r.now+wait)
			}
			continue
		}
		r.linkRR = (qi + 1) % nq
		v := &r.vms[i]
		dur := int64(math.Ceil(v.bits / r.cfg.LinkBps * 1e9))
		r.linkBusy = true
		r.at(r.now+dur, evLinkDone, 0, i)
		return
	}
	if next < math.MaxInt64 && (r.linkWakeAt < 0 || next < r.linkWakeAt) {
		r.linkWakeAt = next
		r.at(next, evLinkWake, 0, 0)
	}
}

func (r *run) linkDone(i int) {
	v := &r.vms[i]
	v.inflight -= v.bytes
	v.sentIv += v.bits
	if r.inWindow() {
		v.sentWin += v.bits
		r.linkBits += v.bits
		r.linkSkbs++
	}
	r.linkBusy = false
	if v.full && v.inflight+v.bytes <= r.cfg.QueueCapBytes {
		v.full = false
		r.makeReady(i)
	}
	r.linkTry()
}
