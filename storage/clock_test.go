package storage

import (
	"sync"
	"time"
)

// fakeClock is a Clock that moves only when told to (Advance).
type fakeClock struct {
	mu      sync.Mutex
	cond    *sync.Cond // signalled when a ticker is made
	now     time.Time
	timers  []*fakeTimer
	tickers int
}

type fakeTimer struct {
	at      time.Time
	every   time.Duration // > 0: a ticker
	c       chan time.Time
	f       func()
	stopped bool
}

func newFakeClock(start time.Time) *fakeClock {
	c := &fakeClock{now: start}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), every: d, c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.tickers++
	c.cond.Broadcast()
	return t.c, func() { c.stop(t) }
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool { return c.stop(t) }
}

func (c *fakeClock) stop(t *fakeTimer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// waitTickers blocks until n tickers have been made.
func (c *fakeClock) waitTickers(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.tickers < n {
		c.cond.Wait()
	}
}

// Advance moves the clock by d and fires what came due: a ticker sends
// the time (dropped when its last tick was not taken, like time.Ticker),
// a timer calls its function in a goroutine.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	live := c.timers[:0]
	for _, t := range c.timers {
		if t.stopped {
			continue
		}
		if t.at.After(c.now) {
			live = append(live, t)
			continue
		}
		if t.every == 0 {
			t.stopped = true
			go t.f()
			continue
		}
		select {
		case t.c <- c.now:
		default:
		}
		for !t.at.After(c.now) {
			t.at = t.at.Add(t.every)
		}
		live = append(live, t)
	}
	c.timers = live
}
