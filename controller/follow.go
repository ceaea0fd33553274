package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"
)

// AgentSide is what Follow drives on an agent's host.
type AgentSide interface {
	// Apply takes the host's desired state: it moves in the VMs that
	// migrate here (DesiredHost.Moves) and has the agent enforce the
	// host's part of the policy (DesiredHost.Policy). An error leaves the
	// agent enforcing what it had; Follow tries again.
	Apply(d DesiredHost) error
	// Report is what the host reports now: its VMs, uplinks and measured
	// per-port rates.
	Report() Report
}

// Follower keeps an agent on the controller: it registers the host (a
// lease, renewed by the reports), watches the host's desired state and
// hands each new one to the agent. When the
// controller or etcd is unreachable the agent keeps enforcing the last
// state; the follower retries every RetryEvery and registers again when
// its lease expired.
type Follower struct {
	Client *Client
	Host   string
	Agent  AgentSide
	// RetryEvery is the wait after a failed request; 0 means 1 s.
	RetryEvery time.Duration
	// Wait is the long poll of one watch; 0 means 30 s.
	Wait time.Duration
	// Log gets, with its level, a record when the host registers, when
	// the connection is lost or back, and errors of Apply; nil: Logf gets
	// them as lines (nil too: discarded).
	Log  *slog.Logger
	Logf func(format string, args ...any)

	// applied is signalled after a desired state with other VMs than the
	// last one was applied: the host reports at once, so that a
	// migration is done (its decision) without waiting for the next
	// report.
	applied chan struct{}
}

func (f *Follower) logAt(level slog.Level, format string, args ...any) {
	switch {
	case f.Log != nil:
		f.Log.Log(context.Background(), level, fmt.Sprintf(format, args...))
	case f.Logf != nil:
		f.Logf(format, args...)
	}
}

// Run follows until ctx ends.
func (f *Follower) Run(ctx context.Context) {
	if f.RetryEvery <= 0 {
		f.RetryEvery = time.Second
	}
	if f.Wait <= 0 {
		f.Wait = 30 * time.Second
	}
	f.applied = make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { defer close(done); f.lease(ctx) }()
	f.watch(ctx)
	<-done
}

// lease registers the host and reports every TTL/3, and at once when the
// agent's running VMs changed (an AgentSide with a Changed channel).
func (f *Follower) lease(ctx context.Context) {
	var changed <-chan struct{}
	if c, ok := f.Agent.(interface{ Changed() <-chan struct{} }); ok {
		changed = c.Changed()
	}
	var id int64
	every, down := f.RetryEvery, false
	for ctx.Err() == nil {
		var err error
		if id == 0 {
			var l Lease
			if l, err = f.Client.Register(ctx, f.Host, f.Agent.Report()); err == nil {
				id, every = l.ID, max(time.Duration(l.TTLSeconds)*time.Second/3, 100*time.Millisecond)
				f.logAt(slog.LevelInfo, "registered %s with the controller (lease %x, %d s)", f.Host, id, l.TTLSeconds)
			}
		} else if err = f.Client.Report(ctx, f.Host, id, f.Agent.Report()); StatusOf(err) == http.StatusNotFound {
			id = 0 // the lease expired: register again at once
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if st := StatusOf(err); (st == http.StatusUnauthorized || st == http.StatusForbidden) && !down {
			// A token revoked, or another host's: say so, not "unreachable".
			f.logAt(slog.LevelError, "controller refused this token (%v): enforcing the last state, retrying every %v", err, f.RetryEvery)
		} else if err != nil && !down {
			f.logAt(slog.LevelWarn, "controller unreachable (%v): enforcing the last state, retrying every %v", err, f.RetryEvery)
		} else if err == nil && down {
			f.logAt(slog.LevelInfo, "controller reachable again")
		}
		down = err != nil
		wait := every
		if down {
			wait = f.RetryEvery
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-f.applied: // VMs came or went: report now
			t.Stop()
		case <-changed: // the host's running VMs changed: report now
			t.Stop()
		}
	}
}

// watch hands every new desired state to the agent (Watch) and signals
// applied when its VMs differ from the last ones applied.
func (f *Follower) watch(ctx context.Context) {
	var vms []string
	w := &Watch{Client: f.Client, Host: f.Host, RetryEvery: f.RetryEvery, Wait: f.Wait,
		Log: func(level slog.Level, msg string) { f.logAt(level, "%s", msg) },
		Apply: func(d DesiredHost) error {
			if err := f.Agent.Apply(d); err != nil {
				return err
			}
			if !slices.Equal(vms, d.VMs) {
				vms = slices.Clone(d.VMs)
				select {
				case f.applied <- struct{}{}:
				default:
				}
			}
			return nil
		}}
	w.Run(ctx)
}
