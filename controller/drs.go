package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/placement"
)

// DRSMode says whether the controller carries out placement's moves.
type DRSMode string

const (
	// DRSManual records placement's moves as recommended decisions; an
	// operator carries one out with Approve (sluice ctl approve SEQ).
	DRSManual DRSMode = "manual"
	// DRSAutomatic carries placement's moves out as soon as it plans them.
	DRSAutomatic DRSMode = "automatic"
)

// ParseDRSMode reads a --drs flag value.
func ParseDRSMode(s string) (DRSMode, error) {
	switch m := DRSMode(s); m {
	case DRSManual, DRSAutomatic:
		return m, nil
	}
	return "", fmt.Errorf("--drs %s: want manual or automatic", s)
}

// A migration is carried out by changing the VM's placement: both hosts'
// desired states change in the same transaction (DesiredHost.VMs), the
// destination's agent moves the VM in (its executor: the lab re-plugs the
// VM's vNICs; libvirt live migration is the hook point not built yet) and
// the source's agent lets it go. The decision is "moving" until the
// destination's agent reports the VM, then "done".

// plannedMoves turns placement's moves into decisions and events of the
// new state st (read as old). In automatic mode each move is carried out
// in st (the VM's host changes; its history notes it); in manual mode it
// is recommended.
func (c *Controller) plannedMoves(moves []placement.Decision, old, st *state) ([]Decision, []Event) {
	var decs []Decision
	var evs []Event
	for _, d := range moves {
		if st.place[d.VM] != d.From {
			continue
		}
		if c.cfg.DRS == DRSAutomatic {
			st.place[d.VM] = d.To
			c.noteMove(old, st, d.VM, d.From, d.To)
			decs = append(decs, Decision{VM: d.VM, From: d.From, To: d.To, Status: "moving", Reason: d.Why})
			evs = append(evs, Event{Kind: "migrate", Subject: d.VM, Message: fmt.Sprintf("moving %s from %s to %s (DRS automatic)", d.VM, d.From, d.To), Reason: d.Why})
			continue
		}
		decs = append(decs, Decision{VM: d.VM, From: d.From, To: d.To, Status: "recommended", Reason: d.Why})
		evs = append(evs, Event{Kind: "recommend", Subject: d.VM, Message: fmt.Sprintf("move %s from %s to %s (DRS manual: sluice ctl approve the decision)", d.VM, d.From, d.To), Reason: d.Why})
	}
	return decs, evs
}

// noteMove records in st's history (a copy of old's) that vm moves now
// from from to to; commit writes it with the move.
func (c *Controller) noteMove(old, st *state, vm, from, to string) {
	if st.history == nil {
		st.history = map[string]placement.LastMove{}
		for k, v := range old.history {
			st.history[k] = v
		}
	}
	st.history[vm] = placement.LastMove{AtNs: c.cfg.Now().UnixNano(), From: from, To: to}
}

// History returns each VM's last migration carried out, as stored.
func (c *Controller) History(ctx context.Context) (map[string]placement.LastMove, error) {
	st, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	if st.history == nil {
		return map[string]placement.LastMove{}, nil
	}
	return st.history, nil
}

func clonePlace(pl placement.Placement) placement.Placement {
	out := placement.Placement{}
	for k, v := range pl {
		out[k] = v
	}
	return out
}

// decision reads decision seq.
func (c *Controller) decision(ctx context.Context, seq int64) (Decision, int64, error) {
	resp, err := c.cfg.Client.Get(ctx, c.key(fmt.Sprintf("%s%020d", dirDecisions, seq)))
	if err != nil {
		return Decision{}, 0, fmt.Errorf("etcd get: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Decision{}, 0, apiErr(http.StatusNotFound, "no decision %d", seq)
	}
	var d Decision
	if err := json.Unmarshal(resp.Kvs[0].Value, &d); err != nil {
		return Decision{}, 0, fmt.Errorf("decision %d: %w", seq, err)
	}
	return d, resp.Kvs[0].ModRevision, nil
}

// rewrite returns the write of decision d with its new status; the
// commit's comparisons keep it from racing another writer.
func (c *Controller) rewrite(d Decision) clientv3.Op {
	b, _ := json.Marshal(d)
	return clientv3.OpPut(c.key(fmt.Sprintf("%s%020d", dirDecisions, d.Seq)), string(b))
}

// Approve carries out a recommended (or pending) decision: the VM must
// still run on the decision's source and fit on its destination.
func (c *Controller) Approve(ctx context.Context, seq int64, reason string) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.loadPolicy(ctx)
	if err != nil {
		return Result{}, err
	}
	d, _, err := c.decision(ctx, seq)
	if err != nil {
		return Result{}, err
	}
	if d.Status != "recommended" && d.Status != "pending" {
		return Result{}, apiErr(http.StatusConflict, "decision %d is %s: only a recommended or pending one can be approved", seq, d.Status)
	}
	reason = reasonOr(reason, fmt.Sprintf("decision %d approved", seq))
	st := &state{p: old.p, doc: old.doc, place: clonePlace(old.place)}
	if h := old.place[d.VM]; h != d.From {
		d.Status = "superseded"
		st.extra = []clientv3.Op{c.rewrite(d)}
		ev := Event{Kind: "refuse", Subject: d.VM, Message: fmt.Sprintf("decision %d superseded: %s runs on %q, not %s", seq, d.VM, h, d.From), Reason: reason}
		_, _ = c.commit(ctx, old, st, []Event{ev}, nil)
		return Result{}, apiErr(http.StatusConflict, "decision %d is stale: %s runs on %q, not %s", seq, d.VM, h, d.From)
	}
	if _, _, err := mustParse(d.VM+".host="+d.To).Apply(old.p, old.place); err != nil {
		return Result{}, apiErr(http.StatusConflict, "decision %d: %s no longer fits on %s: %v", seq, d.VM, d.To, err)
	}
	st.place[d.VM] = d.To
	c.noteMove(old, st, d.VM, d.From, d.To)
	d.Status = "moving"
	st.extra = []clientv3.Op{c.rewrite(d)}
	evs := []Event{{Kind: "migrate", Subject: d.VM, Message: fmt.Sprintf("moving %s from %s to %s (decision %d approved)", d.VM, d.From, d.To, seq), Reason: reason}}
	if evs, err = c.commit(ctx, old, st, evs, nil); err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
}

// finishMoves marks "done" the moving decisions whose VM the agent of
// host now reports.
func (c *Controller) finishMoves(ctx context.Context, host string, vms []string) error {
	ds, err := c.Decisions(ctx, 0, 0)
	if err != nil {
		return err
	}
	var done []Decision
	for _, d := range ds {
		if d.Status == "moving" && d.To == host && slices.Contains(vms, d.VM) {
			done = append(done, d)
		}
	}
	if len(done) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.load(ctx)
	if err != nil {
		return err
	}
	st := &state{p: old.p, doc: old.doc, place: old.place}
	var evs []Event
	for _, d := range done {
		took := c.cfg.Now().Sub(d.Time).Round(time.Millisecond)
		d.Status = "done"
		st.extra = append(st.extra, c.rewrite(d))
		evs = append(evs, Event{Kind: "migrated", Subject: d.VM, Message: fmt.Sprintf("%s runs on %s (decision %d, %v after it)", d.VM, host, d.Seq, took),
			Reason: "reported by the agent of " + host})
	}
	_, err = c.commit(ctx, old, st, evs, nil)
	return err
}

// DRSPass runs one placement pass over the cluster as it runs now (with
// the measured rates the agents reported as network demand): faults are
// repaired and, with RebalanceThreshold ≥ 2, the cluster is rebalanced;
// a VM moved less than placement's cooldown ago does not move again, nor
// back to where it came from (no ping-pong). A move already recommended
// is not recommended twice.
func (c *Controller) DRSPass(ctx context.Context) (Result, error) {
	hosts, err := c.Hosts(ctx)
	if err != nil {
		return Result{}, err
	}
	demand := placement.Demand{NetBps: map[string]float64{}}
	for _, h := range hosts {
		if h.Report != nil {
			for port, r := range h.Report.RatesBps {
				demand.NetBps[port] = r
			}
		}
	}
	ds, err := c.Decisions(ctx, 0, 0)
	if err != nil {
		return Result{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.load(ctx)
	if err != nil || old.p == nil {
		return Result{}, err
	}
	r := placement.Plan(old.p, old.place, demand, placement.Options{Threshold: c.cfg.RebalanceThreshold,
		NowNs: c.cfg.Now().UnixNano(), History: old.history})
	var moves []placement.Decision
	for _, m := range r.Moves() {
		dup := slices.ContainsFunc(ds, func(d Decision) bool {
			return (d.Status == "recommended" && c.cfg.DRS == DRSManual || d.Status == "moving") && d.VM == m.VM && d.To == m.To
		})
		if !dup {
			moves = append(moves, m)
		}
	}
	if len(moves) == 0 {
		return Result{Revision: old.doc.Revision, Events: []Event{}}, nil
	}
	st := &state{p: old.p, doc: old.doc, place: clonePlace(old.place)}
	decs, evs := c.plannedMoves(moves, old, st)
	if evs, err = c.commit(ctx, old, st, evs, decs); err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
}

// RunDRS runs DRSPass every interval until ctx ends; errors go to logf.
func (c *Controller) RunDRS(ctx context.Context, interval time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := c.DRSPass(ctx); err != nil && ctx.Err() == nil && logf != nil {
				logf("DRS pass: %v", err)
			}
		}
	}
}
