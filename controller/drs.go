package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
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
// desired states change in the same transaction (DesiredHost.VMs, and
// DesiredHost.Moves on the destination), the destination's agent migrates
// the VM in (the lab re-plugs its vNICs; a libvirt host migrates it live)
// and the source's agent lets it go. The decision is "moving" until the
// destination's agent reports the VM ("done") or reports that it could not
// move it ("failed", with its reason).

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
// still run on the decision's source and fit on its destination
// (view.approve).
func (c *Controller) Approve(ctx context.Context, seq int64, reason string) (Result, error) {
	if err := checkText("reason", reason); err != nil {
		return Result{}, err
	}
	d, _, err := c.decision(ctx, seq)
	if err != nil {
		return Result{}, err
	}
	return c.decide(ctx, true, func(v view) (*next, error) { return v.approve(d, reason) })
}

// DRSPass runs one placement pass over the cluster as it runs now
// (view.drs: the VMs that hold reservations, with the measured rates the
// agents reported as network demand).
func (c *Controller) DRSPass(ctx context.Context) (Result, error) {
	ds, err := c.allDecisions(ctx)
	if err != nil {
		return Result{}, err
	}
	var rev int64
	res, err := c.decide(ctx, false, func(v view) (*next, error) {
		rev = v.doc.Revision
		if v.p == nil {
			return nil, nil
		}
		demand := placement.Demand{NetBps: map[string]float64{}}
		for _, r := range v.reports {
			maps.Copy(demand.NetBps, r.RatesBps)
		}
		return v.drs(demand, ds, c.cfg.RebalanceThreshold, c.cfg.DRS), nil
	})
	if err == nil && res.Events == nil {
		res = Result{Revision: rev, Events: []Event{}}
	}
	return res, err
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
