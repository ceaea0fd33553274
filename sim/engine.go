// Package sim is the discrete-event twin of a sluice cluster: it runs the
// same entitlement and scheduling algorithms as the live system over models
// of uplinks, vCPUs, datastores and workloads, so that a policy can be tried
// before it is applied and the seed experiments can be reproduced.
//
// sim never reads the wall clock and never touches the network or the
// kernel: simulated time is an int64 count of nanoseconds, randomness comes
// from one seeded generator, and the same scenario with the same seed gives
// byte-identical output.
package sim

import "math/rand/v2"

// Second is one simulated second in nanoseconds.
const Second int64 = 1_000_000_000

// Engine is a deterministic discrete-event loop: a heap of events ordered by
// time, ties broken by the order in which they were scheduled.
type Engine struct {
	nowNs  int64
	seq    uint64
	events eventHeap
	// Fired counts the events run so far (for events/s benchmarks).
	Fired uint64
	// Rand is the one source of randomness of a run, seeded by NewEngine.
	Rand *rand.Rand
}

type event struct {
	atNs int64
	seq  uint64
	fn   func()
}

// eventHeap is a binary min-heap of events by (atNs, seq), typed so that
// scheduling and firing an event allocate nothing beyond its closure
// (container/heap boxes every pushed and popped value).
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].atNs != h[j].atNs {
		return h[i].atNs < h[j].atNs
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(ev event) {
	*h = append(*h, ev)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

// pop removes and returns the earliest event; the heap must not be empty.
func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = event{}
	q = q[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		m := l
		if r := l + 1; r < len(q) && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// NewEngine returns an engine at time 0 whose random source is seeded
// with seed.
func NewEngine(seed uint64) *Engine {
	return &Engine{Rand: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// NowNs is the current simulated time in nanoseconds.
func (e *Engine) NowNs() int64 { return e.nowNs }

// At schedules fn to run at time atNs (not before the current time).
func (e *Engine) At(atNs int64, fn func()) {
	if atNs < e.nowNs {
		atNs = e.nowNs
	}
	e.seq++
	e.events.push(event{atNs: atNs, seq: e.seq, fn: fn})
}

// After schedules fn to run delayNs after the current time.
func (e *Engine) After(delayNs int64, fn func()) { e.At(e.nowNs+delayNs, fn) }

// Pending is the number of scheduled events.
func (e *Engine) Pending() int { return len(e.events) }

// Run fires events in order until none is left or the next one is later
// than untilNs; the clock then stands at untilNs.
func (e *Engine) Run(untilNs int64) {
	for len(e.events) > 0 && e.events[0].atNs <= untilNs {
		ev := e.events.pop()
		e.nowNs = ev.atNs
		e.Fired++
		ev.fn()
	}
	if untilNs > e.nowNs {
		e.nowNs = untilNs
	}
}
