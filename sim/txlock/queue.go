package txlock

import "math"

// vmState is a VM's sender, its HTB leaf (or EDT clock) and its counters.
type vmState struct {
	VM
	queue     int     // its TX queue; -1 for EDT (the sending CPU's)
	bits      float64 // wire bits of one skb
	bytes     int64   // wire bytes of one skb
	weight    float64 // quantum: shares
	inflight  int64   // bytes picked by its CPU and not yet on the wire
	nextGenNs float64 // when a VM with a finite demand may offer its next skb
	inReady   bool    // among the ready VMs
	full      bool    // waiting for the link to send one of its skbs
	timed     bool    // waiting for an evVMWake

	// The qdisc's view: skbs queued, and per form either the HTB leaf's
	// token buckets (bits; rate = entitlement, ceil = limit or the queue's
	// root) or fq's departure stamps.
	queued    int
	rateBps   float64
	ceilBps   float64
	tok, ctok float64
	lastNs    int64
	vtime     float64 // fair-queueing clock among siblings (HTB's DRR by quantum)
	nextStamp float64 // EDT: the stamp of the VM's next skb

	sentIv, sentWin float64 // wire bits sent in the interval, in the window
	hist            []histEntry
}

type histEntry struct{ usedBps, rateBps float64 }

// queue is one qdisc: the single HTB, one queue's HTB under mq, or one
// queue's fq.
type queue struct {
	form   Form
	vms    []int
	queued int
	// The root class of a per-queue HTB: rate = ceil = the sum of its VMs'
	// entitlements, re-set every interval.
	rootBps, rootTok float64
	rootLast         int64
	maxSkbBits       float64 // the largest skb of its VMs (the root's burst)
	vclock           float64
	// fq: the skbs by departure stamp (then order of arrival).
	edt    []stamped
	edtSeq uint64
}

type stamped struct {
	atNs float64
	seq  uint64
	vm   int
}

func (a stamped) before(b stamped) bool {
	return a.atNs < b.atNs || (a.atNs == b.atNs && a.seq < b.seq)
}

// burst is HTB's burst as the agent sizes it: 2 ms of the rate, at least
// two skbs.
func burst(rateBps, skbBits float64) float64 { return math.Max(rateBps*0.002, 2*skbBits) }

func (q *queue) push(r *run, i int) {
	v := &r.vms[i]
	if v.queued == 0 {
		v.vtime = math.Max(v.vtime, q.vclock)
	}
	v.queued++
	q.queued++
	if q.form != FormEDTFQ {
		return
	}
	stamp := math.Max(float64(r.now), v.nextStamp)
	v.nextStamp = stamp + v.bits/v.rateBps*1e9
	q.edtSeq++
	h := append(q.edt, stamped{atNs: stamp, seq: q.edtSeq, vm: i})
	for k := len(h) - 1; k > 0; {
		p := (k - 1) / 2
		if !h[k].before(h[p]) {
			break
		}
		h[k], h[p] = h[p], h[k]
		k = p
	}
	q.edt = h
}

// pop takes the skb the discipline sends now: its VM, or -1 and the time
// (ns from now, 0 for never) until one is eligible.
func (q *queue) pop(r *run) (int, int64) {
	if q.queued == 0 {
		return -1, 0
	}
	if q.form == FormEDTFQ {
		return q.popEDT(r)
	}
	return q.popHTB(r)
}

func (q *queue) popEDT(r *run) (int, int64) {
	h := q.edt
	if h[0].atNs > float64(r.now) {
		return -1, int64(math.Ceil(h[0].atNs)) - r.now
	}
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for k := 0; ; {
		l, m := 2*k+1, k
		if l < n && h[l].before(h[m]) {
			m = l
		}
		if rr := l + 1; rr < n && h[rr].before(h[m]) {
			m = rr
		}
		if m == k {
			break
		}
		h[k], h[m] = h[m], h[k]
		k = m
	}
	q.edt = h
	r.vms[top.vm].queued--
	q.queued--
	return top.vm, 0
}

// popHTB is HTB at one level of leaves under a root: a leaf within its rate
// sends first; otherwise a leaf within its ceil borrows, if the root (the
// queue's rate in mq-htb; the link in the single tree) has tokens. Among
// leaves of one mode the least served by quantum goes first.
func (q *queue) popHTB(r *run) (int, int64) {
	now := r.now
	if q.form == FormPerQueueHTB {
		q.rootTok = math.Min(q.rootTok+q.rootBps*float64(now-q.rootLast)/1e9, burst(q.rootBps, q.maxSkbBits))
		q.rootLast = now
	}
	green, yellow := -1, -1
	wait := math.Inf(1)
	for _, i := range q.vms {
		v := &r.vms[i]
		if v.queued == 0 {
			continue
		}
		dt := float64(now-v.lastNs) / 1e9
		v.tok = math.Min(v.tok+v.rateBps*dt, burst(v.rateBps, v.bits))
		v.ctok = math.Min(v.ctok+v.ceilBps*dt, burst(v.ceilBps, v.bits))
		v.lastNs = now
		if v.tok >= 0 {
			if green < 0 || v.vtime < r.vms[green].vtime {
				green = i
			}
			continue
		}
		w := -v.tok / v.rateBps * 1e9
		if v.ctok >= 0 && (q.form != FormPerQueueHTB || q.rootTok >= 0) {
			if yellow < 0 || v.vtime < r.vms[yellow].vtime {
				yellow = i
			}
			continue
		}
		b := -v.ctok / v.ceilBps * 1e9
		if q.form == FormPerQueueHTB && q.rootTok < 0 {
			b = math.Max(b, -q.rootTok/q.rootBps*1e9)
		}
		wait = math.Min(wait, math.Min(w, b))
	}
	pick := green
	if pick < 0 {
		pick = yellow
	}
	if pick < 0 {
		if math.IsInf(wait, 1) {
			return -1, 0
		}
		return -1, max(1, int64(math.Ceil(wait)))
	}
	v := &r.vms[pick]
	v.tok -= v.bits
	v.ctok -= v.bits
	if q.form == FormPerQueueHTB {
		q.rootTok -= v.bits
	}
	v.vtime += v.bits / v.weight
	q.vclock = v.vtime
	v.queued--
	q.queued--
	return pick, 0
}
