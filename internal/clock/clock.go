// Package clock is sluice's one source of time for code that tests drive
// step by step: the agent's control loop and policy watch, the storage
// gateway's control period and schedulers (after Tailscale's
// tstime.Clock). Real is the time package; tests pass a fake.
package clock

import (
	"context"
	"time"
)

// Clock gives time, tickers and timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTicker returns a channel that receives the time every d (a slow
	// reader misses ticks, as with time.Ticker), and the function that
	// stops it.
	NewTicker(d time.Duration) (c <-chan time.Time, stop func())
	// AfterFunc calls f in its own goroutine once d has passed, and returns
	// the function that cancels it (true if that stopped the call).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// Real is Clock on the time package.
var Real Clock = real{}

type real struct{}

func (real) Now() time.Time { return time.Now() }

func (real) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

func (real) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// Or is c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

// Sleep waits d on c.
func Sleep(c Clock, d time.Duration) {
	done := make(chan struct{})
	c.AfterFunc(d, func() { close(done) })
	<-done
}

// SleepCtx waits d in real time, or until ctx ends (then false).
func SleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// SleepCtxOn waits d on c (nil: real time), or until ctx ends (then
// false).
func SleepCtxOn(ctx context.Context, c Clock, d time.Duration) bool {
	done := make(chan struct{})
	stop := Or(c).AfterFunc(d, func() { close(done) })
	select {
	case <-ctx.Done():
		stop()
		return false
	case <-done:
		return true
	}
}
