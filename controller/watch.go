package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"sluice/internal/clock"
)

// Watch follows the desired state of one host for a daemon on it (the
// agent through Follower, the storage gateway): it long-polls the
// controller (Client.WatchDesired) and hands every new revision to Apply.
// While the controller cannot be reached, or Apply fails, the daemon keeps
// what it has and Watch tries again every RetryEvery; an Apply that failed
// gets the same revision again. A revision without a policy (written by a
// controller that publishes none) is skipped.
type Watch struct {
	// Client asks the controller; Host is the host whose desired state
	// is followed.
	Client *Client
	Host   string
	// From is the revision the daemon already has (0: none); Apply gets
	// only later ones.
	From int64
	// RetryEvery is the wait after a failed request or Apply; 0 means 1 s.
	RetryEvery time.Duration
	// Wait is the long poll of one request; 0 means 30 s.
	Wait time.Duration
	// Apply takes a new desired state (its Policy is never nil). An error
	// leaves the revision pending: it is applied again after RetryEvery.
	Apply func(DesiredHost) error
	// Log gets one line per distinct failure in a row (slog.LevelWarn):
	// the controller unreachable, a state without a policy, an Apply that
	// failed. nil: discarded.
	Log func(level slog.Level, msg string)
	// Clock times the retries; nil: real time.
	Clock clock.Clock
}

// Run follows the host's desired state until ctx ends.
func (w *Watch) Run(ctx context.Context) {
	retry, wait := w.RetryEvery, w.Wait
	if retry <= 0 {
		retry = time.Second
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	rev := w.From
	lastErr := ""
	// fail reports err unless it is the last one reported, and waits
	// retry; false when ctx ended.
	fail := func(err error) bool {
		if ctx.Err() != nil {
			return false
		}
		if msg := err.Error(); msg != lastErr {
			if w.Log != nil {
				w.Log(slog.LevelWarn, msg)
			}
			lastErr = msg
		}
		return clock.SleepCtxOn(ctx, w.Clock, retry)
	}
	for ctx.Err() == nil {
		d, err := w.Client.WatchDesired(ctx, w.Host, rev, wait)
		if err != nil {
			if !fail(fmt.Errorf("watching the desired state of %s: %w", w.Host, err)) {
				return
			}
			continue
		}
		if d.Revision == 0 || d.Revision == rev {
			continue // nothing published yet, or the long poll ended
		}
		if d.Policy == nil {
			rev = d.Revision
			if !fail(fmt.Errorf("desired state %d of %s has no policy: keeping the last one (upgrade the controller)", d.Revision, w.Host)) {
				return
			}
			continue
		}
		if err := w.Apply(d); err != nil {
			if !fail(fmt.Errorf("applying desired state %d of %s: %w", d.Revision, w.Host, err)) {
				return
			}
			continue // rev unchanged: the next request returns d at once
		}
		rev, lastErr = d.Revision, ""
	}
}
