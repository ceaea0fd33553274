package storage

import "time"

// Clock is the gateway's source of time (after Tailscale's tstime.Clock).
// Options.Clock nil means real time; tests pass a fake to drive the
// control loop period by period.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTicker returns a channel that receives the time every d, and the
	// function that stops it.
	NewTicker(d time.Duration) (c <-chan time.Time, stop func())
	// AfterFunc calls f in its own goroutine once d has passed, and returns
	// the function that cancels it (true if that stopped the call).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// realClock is Clock on the time package.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// sleep waits d on clk.
func sleep(clk Clock, d time.Duration) {
	done := make(chan struct{})
	clk.AfterFunc(d, func() { close(done) })
	<-done
}
