package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Bounds on what a request can make the controller store and return, so
// that no client can grow the state or a response without limit
// (docs/controller.md, "Security").
const (
	// MaxReasonBytes bounds a request's reason (and each change of a
	// set): a longer one is refused with 400 naming the field, nothing
	// written.
	MaxReasonBytes = 1024
	// maxEventText bounds an event's message and reason and a decision's
	// reason as stored: text the controller composes from what agents
	// report (a failed move's error, a domain's name) is cut there, with
	// a marker saying how much was cut.
	maxEventText = 4096
	// maxFaultEvents is how many fault events one change records; the
	// faults beyond are summed up in one more.
	maxFaultEvents = 20
	// maxChangeEvents is how many events one change records at most; the
	// events beyond are summed up in one more (kind "more").
	maxChangeEvents = 200
	// DefaultPageLimit and MaxPageLimit are the default and the largest
	// limit of GET /v1/events and /v1/decisions; maxPageBytes bounds the
	// stored bytes of one page (at least one entry is returned).
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
	maxPageBytes     = 512 << 10
)

// Defaults of the retention of events and decisions (Config).
const (
	DefaultMaxEvents    = 10_000
	DefaultMaxDecisions = 1_000
	DefaultEventTTL     = 7 * 24 * time.Hour
)

// checkText refuses a request field longer than MaxReasonBytes.
func checkText(field, s string) error {
	if len(s) > MaxReasonBytes {
		return apiErr(http.StatusBadRequest, "%s: %d bytes, at most %d", field, len(s), MaxReasonBytes)
	}
	return nil
}

// clip cuts s to at most max bytes (on a rune boundary), saying how much
// was cut.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max - 40
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes cut)", len(s)-cut)
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// boundEvents clips the texts of evs and decs and keeps at most
// maxChangeEvents events, the last one summing up those left out.
func boundEvents(evs []Event, decs []Decision) []Event {
	for i := range evs {
		evs[i].Message = clip(evs[i].Message, maxEventText)
		evs[i].Reason = clip(evs[i].Reason, maxEventText)
		evs[i].Subject = clip(evs[i].Subject, MaxReasonBytes)
	}
	for i := range decs {
		decs[i].Reason = clip(decs[i].Reason, maxEventText)
	}
	if len(evs) <= maxChangeEvents {
		return evs
	}
	kept, left := evs[:maxChangeEvents-1], evs[maxChangeEvents-1:]
	return append(kept, Event{Kind: "more", Subject: "cluster",
		Message: fmt.Sprintf("%d more events of this change not recorded (%s)", len(left), kindCounts(left)),
		Reason:  fmt.Sprintf("at most %d events are recorded per change", maxChangeEvents)})
}

// kindCounts is "3 fault, 2 observed" for evs.
func kindCounts(evs []Event) string {
	n := map[string]int{}
	for _, e := range evs {
		n[e.Kind]++
	}
	var parts []string
	for _, k := range sortedKeys(n) {
		parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
	}
	return strings.Join(parts, ", ")
}

// terminal tells whether a decision's status is final (done, failed,
// superseded) or a recommendation: the retention may delete it. Pending
// and moving decisions are kept whatever their age.
func terminal(status string) bool {
	return status != "moving" && status != "pending"
}

// Prune deletes the events older than Config.EventTTL and the decisions
// older than it that are no longer under way, then the oldest of those
// beyond Config.MaxDecisions. (Commit already keeps at most MaxEvents
// events.) It returns how many keys it deleted. A controller runs it
// periodically (RunPrune).
func (c *Controller) Prune(ctx context.Context) (int, error) {
	now := c.cfg.Now()
	n := 0
	// Events are numbered in time order: delete from the oldest until one
	// is young enough.
	for {
		resp, err := c.cfg.Client.Get(ctx, c.key(dirEvents), clientv3.WithPrefix(), clientv3.WithLimit(500))
		if err != nil {
			return n, fmt.Errorf("etcd get: %w", err)
		}
		var old []clientv3.Op
		for _, kv := range resp.Kvs {
			var e Event
			if json.Unmarshal(kv.Value, &e) == nil && now.Sub(e.Time) < c.cfg.EventTTL {
				break
			}
			old = append(old, clientv3.OpDelete(string(kv.Key)))
		}
		if len(old) > 0 {
			if _, err := c.cfg.Client.Txn(ctx).Then(old...).Commit(); err != nil {
				return n, fmt.Errorf("etcd txn: %w", err)
			}
			n += len(old)
		}
		if len(old) < len(resp.Kvs) || !resp.More {
			break
		}
	}
	resp, err := c.cfg.Client.Get(ctx, c.key(dirDecisions), clientv3.WithPrefix())
	if err != nil {
		return n, fmt.Errorf("etcd get: %w", err)
	}
	var gone []*mvccKV
	for _, kv := range resp.Kvs {
		var d Decision
		if json.Unmarshal(kv.Value, &d) != nil || !terminal(d.Status) {
			continue
		}
		if now.Sub(d.Time) >= c.cfg.EventTTL {
			gone = append(gone, kv)
		}
	}
	// Beyond the count: the oldest that may go.
	over := len(resp.Kvs) - len(gone) - c.cfg.MaxDecisions
	for _, kv := range resp.Kvs {
		if over <= 0 {
			break
		}
		var d Decision
		if json.Unmarshal(kv.Value, &d) != nil || !terminal(d.Status) || slices.Contains(gone, kv) {
			continue
		}
		gone = append(gone, kv)
		over--
	}
	// Each delete holds only if the decision did not change since it was
	// read (an approval rewrites it).
	for chunk := range slices.Chunk(gone, 100) {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, kv := range chunk {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		r, err := c.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return n, fmt.Errorf("etcd txn: %w", err)
		}
		if r.Succeeded {
			n += len(chunk)
		}
	}
	return n, nil
}

// RunPrune runs Prune every interval until ctx ends; errors go to logf.
func (c *Controller) RunPrune(ctx context.Context, interval time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := c.Prune(ctx); err != nil && ctx.Err() == nil && logf != nil {
			logf("pruning events and decisions: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// trimEventsOp deletes the events numbered seq-MaxEvents and below, so
// that at most MaxEvents remain after a commit that numbered up to seq.
func (c *Controller) trimEventsOp(seq int64) (clientv3.Op, bool) {
	keep := int64(c.cfg.MaxEvents)
	if seq <= keep {
		return clientv3.Op{}, false
	}
	return clientv3.OpDelete(c.key(dirEvents), clientv3.WithRange(c.key(fmt.Sprintf("%s%020d", dirEvents, seq-keep+1)))), true
}
