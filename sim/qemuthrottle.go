package sim

import (
	"math"

	"sluice/throttle"
)

// qemuThrottle is QEMU's I/O throttle of one disk (util/throttle.c) as
// the throttle driver sets it: total_iops_sec with size_iops_sec =
// throttle.UnitBytes and no burst rate. It is a leaky bucket that drains
// at the rate and holds a tenth of a second of it (QEMU's bucket when no
// max is set): a request may leave when the bucket's level is at most
// that size, and then adds its units, max(1, bytes / UnitBytes), to the
// level. A request that may not leave waits, in order, in the disk's
// queue (QEMU queues every request behind one that waits). The
// total_bytes_sec the driver sets with it is the same rate in bytes and
// never holds a request longer than the IOPS bucket, so it is not
// modelled. Setting a throttle empties the bucket, as QEMU does.
type qemuThrottle struct {
	eng    *Engine
	iops   float64 // total_iops_sec; 0: no throttle
	level  float64 // units in the bucket at lastNs
	lastNs int64
	queue  []*ioReq
	head   int // queue[head:] wait
	gen    int // the armed timer's generation (older timers are void)
	armed  bool
	pass   func(*ioReq) // sends a request on, below the throttle
	sets   int          // throttles set (the driver's SetBlockIoTune calls)
}

// throttleUnits is what an I/O of b bytes counts in an IOPS throttle.
func throttleUnits(b int64) float64 {
	return math.Max(1, float64(b)/throttle.UnitBytes)
}

// leak drains the bucket up to now.
func (t *qemuThrottle) leak(now int64) {
	if t.iops > 0 && now > t.lastNs {
		t.level = math.Max(0, t.level-t.iops*float64(now-t.lastNs)/1e9)
	}
	t.lastNs = now
}

// submit takes a request from the guest.
func (t *qemuThrottle) submit(q *ioReq) {
	t.queue = append(t.queue, q)
	if len(t.queue)-t.head == 1 && !t.armed {
		t.run()
	}
}

// set changes the throttle (iops 0: none) and empties the bucket; the
// requests waiting are looked at again.
func (t *qemuThrottle) set(iops float64) {
	now := t.eng.NowNs()
	t.leak(now)
	t.iops, t.level = iops, 0
	t.sets++
	t.armed = false
	t.gen++
	t.run()
}

// run lets every request at the head of the queue that the bucket
// allows go on, and arms a timer for the next one.
func (t *qemuThrottle) run() {
	now := t.eng.NowNs()
	t.leak(now)
	for t.head < len(t.queue) {
		if t.iops > 0 {
			// A tiny tolerance: the timer's time is rounded up to a whole
			// ns, so the level is then at most the bucket but for the
			// float's rounding.
			if over := t.level - t.iops/10; over > 1e-9 {
				wait := int64(math.Ceil(over / t.iops * 1e9))
				t.compact()
				t.gen++
				g := t.gen
				t.armed = true
				t.eng.After(wait, func() {
					if g == t.gen {
						t.armed = false
						t.run()
					}
				})
				return
			}
			t.level += throttleUnits(t.queue[t.head].bytes)
		}
		q := t.queue[t.head]
		t.queue[t.head] = nil
		t.head++
		t.pass(q)
	}
	t.queue, t.head = t.queue[:0], 0
}

// compact drops the requests that left from the front of the queue once
// they are most of it (a disk that stays backlogged never empties it).
func (t *qemuThrottle) compact() {
	if t.head > 64 && 2*t.head > len(t.queue) {
		n := copy(t.queue, t.queue[t.head:])
		clear(t.queue[n:])
		t.queue, t.head = t.queue[:n], 0
	}
}

// waiting is the number of requests in the throttle's queue.
func (t *qemuThrottle) waiting() int { return len(t.queue) - t.head }
