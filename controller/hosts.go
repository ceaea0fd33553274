package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/entitle"
)

// Hosts lists the hosts of the policy (and registered hosts it does not
// name) with the VMs placed there, the reservations held there (by the
// VMs that run, start or move there) and their agents' last reports.
func (c *Controller) Hosts(ctx context.Context) ([]HostInfo, error) {
	st, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	reports, err := c.reports(ctx)
	if err != nil {
		return nil, err
	}
	out := []HostInfo{}
	seen := map[string]bool{}
	if st.p != nil {
		// Each VM and uplink visited once (not once per host).
		byName := map[string]*HostInfo{}
		for _, h := range st.p.Hosts {
			out = append(out, HostInfo{Name: h.Name, VMs: []string{}, Uplinks: []string{}, Report: reports[h.Name], Registered: reports[h.Name] != nil})
			seen[h.Name] = true
		}
		for i := range out {
			byName[out[i].Name] = &out[i]
		}
		for _, v := range st.p.VMs {
			if hi := byName[st.place[v.Name]]; hi != nil {
				hi.VMs = append(hi.VMs, v.Name)
			}
		}
		for _, u := range entitle.Derive(st.p, entitle.Live{Hosts: c.viewOf(st, reports).holding()}).Uplinks {
			hi := byName[u.Host]
			if hi == nil {
				continue
			}
			hi.Uplinks = append(hi.Uplinks, u.Uplink)
			for _, cl := range u.Classes {
				for _, v := range cl.VNICs {
					hi.ReservedBps += v.ReservationBps
				}
			}
		}
	}
	for _, name := range sortedKeys(reports) {
		if !seen[name] {
			out = append(out, HostInfo{Name: name, Registered: true, VMs: []string{}, Uplinks: []string{}, Report: reports[name]})
		}
	}
	return out, nil
}

// Events returns the events numbered after after, oldest first: at most
// limit (0: DefaultPageLimit; at most MaxPageLimit) and at most about
// maxPageBytes of them, at least one. Fewer than limit does not mean
// there are no more: the next page is after the last one's number.
func (c *Controller) Events(ctx context.Context, after int64, limit int64) ([]Event, error) {
	out := []Event{}
	return out, c.list(ctx, dirEvents, after, limit, func(b []byte) error {
		var e Event
		if err := json.Unmarshal(b, &e); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
}

// Decisions returns the recorded migrations numbered after after, oldest
// first, paged as Events.
func (c *Controller) Decisions(ctx context.Context, after int64, limit int64) ([]Decision, error) {
	out := []Decision{}
	return out, c.list(ctx, dirDecisions, after, limit, func(b []byte) error {
		var d Decision
		if err := json.Unmarshal(b, &d); err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
}

// allDecisions returns every recorded decision, page by page.
func (c *Controller) allDecisions(ctx context.Context) ([]Decision, error) {
	var all []Decision
	after := int64(0)
	for {
		ds, err := c.Decisions(ctx, after, MaxPageLimit)
		if err != nil || len(ds) == 0 {
			return all, err
		}
		all = append(all, ds...)
		after = ds[len(ds)-1].Seq
	}
}

func (c *Controller) list(ctx context.Context, dir string, after, limit int64, each func([]byte) error) error {
	switch {
	case limit <= 0:
		limit = DefaultPageLimit
	case limit > MaxPageLimit:
		limit = MaxPageLimit
	}
	from := c.key(fmt.Sprintf("%s%020d", dir, after+1))
	end := clientv3.GetPrefixRangeEnd(c.key(dir))
	resp, err := c.cfg.Client.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(limit))
	if err != nil {
		return fmt.Errorf("etcd get: %w", err)
	}
	size := 0
	for i, kv := range resp.Kvs {
		if size += len(kv.Value); i > 0 && size > maxPageBytes {
			break
		}
		if err := each(kv.Value); err != nil {
			return fmt.Errorf("%s: %w", kv.Key, err)
		}
	}
	return nil
}

// Register records an agent's host under a new lease of HostTTLSeconds.
// The host must be in the policy once one is applied.
func (c *Controller) Register(ctx context.Context, host string, r Report) (Lease, error) {
	st, err := c.load(ctx)
	if err != nil {
		return Lease{}, err
	}
	if st.p != nil && st.p.Host(host) == nil {
		return Lease{}, apiErr(http.StatusNotFound, "no host %q in the policy", host)
	}
	r = named(r, c.vmNames(st.p))
	g, err := c.cfg.Client.Grant(ctx, c.cfg.HostTTLSeconds)
	if err != nil {
		return Lease{}, fmt.Errorf("etcd lease grant: %w", err)
	}
	if err := c.putReport(ctx, host, int64(g.ID), r); err != nil {
		return Lease{}, err
	}
	c.noteRates(st, host, &r)
	ev := Event{Kind: "register", Subject: host, Message: fmt.Sprintf("agent of %s registered: %d VMs, uplinks %s", host, len(r.VMs), strings.Join(r.Uplinks, ",")),
		Reason: fmt.Sprintf("lease %x, %d s", g.ID, c.cfg.HostTTLSeconds)}
	if err := c.observe(ctx, host, nil, &r, ev); err != nil {
		return Lease{}, err
	}
	return Lease{ID: int64(g.ID), TTLSeconds: c.cfg.HostTTLSeconds}, nil
}

func (c *Controller) putReport(ctx context.Context, host string, lease int64, r Report) error {
	if r.Time.IsZero() {
		r.Time = c.cfg.Now().UTC()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return apiErr(http.StatusBadRequest, "report: %v", err)
	}
	resp, err := c.cfg.Client.Put(ctx, c.key(dirHosts+host), string(b), clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		return fmt.Errorf("etcd put: %w", err)
	}
	c.rep.put(host, &r, resp.Header.Revision)
	return nil
}

// checkLease fails with 404 when host is not registered under lease (the
// lease expired: the agent registers again).
func (c *Controller) checkLease(ctx context.Context, host string, lease int64) error {
	resp, err := c.cfg.Client.Get(ctx, c.key(dirHosts+host))
	if err != nil {
		return fmt.Errorf("etcd get: %w", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].Lease != lease {
		return apiErr(http.StatusNotFound, "host %s holds no lease %x: register again", host, lease)
	}
	return nil
}

// Heartbeat renews a host's lease.
func (c *Controller) Heartbeat(ctx context.Context, host string, lease int64) error {
	if err := c.checkLease(ctx, host, lease); err != nil {
		return err
	}
	if _, err := c.cfg.Client.KeepAliveOnce(ctx, clientv3.LeaseID(lease)); err != nil {
		return apiErr(http.StatusNotFound, "lease %x: %v: register again", lease, err)
	}
	return nil
}

// Report replaces a host's report and renews its lease.
func (c *Controller) Report(ctx context.Context, host string, lease int64, r Report) error {
	if err := c.Heartbeat(ctx, host, lease); err != nil {
		return err
	}
	resp, err := c.cfg.Client.Get(ctx, c.key(dirHosts+host))
	if err != nil {
		return fmt.Errorf("etcd get: %w", err)
	}
	var old *Report
	if len(resp.Kvs) > 0 {
		old = &Report{}
		if json.Unmarshal(resp.Kvs[0].Value, old) != nil {
			old = nil
		}
	}
	st, err := c.load(ctx)
	if err != nil {
		return err
	}
	r = named(r, c.vmNames(st.p))
	if err := c.putReport(ctx, host, lease, r); err != nil {
		return err
	}
	c.noteRates(st, host, &r)
	return c.observe(ctx, host, old, &r)
}

// observe takes host's new report r (old: the one it replaces, nil at
// registration) into the state (view.report): moves done or failed,
// starting VMs seen, VMs and domains that run outside the plan; extra
// events (a registration) are recorded with it. A report that says what
// the last one said, with no failed move, writes nothing.
func (c *Controller) observe(ctx context.Context, host string, old, r *Report, extra ...Event) error {
	if old != nil && len(extra) == 0 && slices.Equal(old.VMs, r.VMs) && slices.Equal(old.Unnamed, r.Unnamed) && len(r.Failed) == 0 {
		return nil
	}
	// The recorded decisions matter only when a move to this host is
	// under way or the host could not make one.
	st, err := c.load(ctx)
	if err != nil {
		return err
	}
	var ds []Decision
	if len(r.Failed) > 0 || slices.ContainsFunc(slices.Collect(maps.Values(st.starting)), func(s Start) bool { return s.Move && s.Host == host }) {
		if ds, err = c.allDecisions(ctx); err != nil {
			return err
		}
	}
	_, err = c.decide(ctx, false, func(v view) (*next, error) {
		var n *next
		if v.p != nil {
			n = v.report(host, old, r, ds)
		}
		if len(extra) > 0 {
			if n == nil {
				n = v.from()
			}
			n.events = append(n.events, extra...)
		}
		return n, nil
	})
	return err
}

// MaxWatch bounds the wait of one WatchDesired.
const MaxWatch = 60 * time.Second

// WatchDesired returns host's desired state as soon as its revision is
// larger than after, or when wait has passed (then with the revision
// unchanged). Revision 0: nothing is published for the host yet. The
// polls share one etcd watch (desiredHub).
func (c *Controller) WatchDesired(ctx context.Context, host string, after int64, wait time.Duration) (DesiredHost, error) {
	return c.watchDesired(ctx, host, after, wait, nil)
}

// watchDesired is WatchDesired calling waiting (if not nil) once, when
// the poll starts to wait for a change: the API gives back the request's
// seat then.
func (c *Controller) watchDesired(ctx context.Context, host string, after int64, wait time.Duration, waiting func()) (DesiredHost, error) {
	wait = min(max(wait, 0), MaxWatch)
	key := c.key(dirDesired + host)
	c.hub.start(c.cfg.Client, c.key(dirDesired))
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		changed := c.hub.wait(host) // before the read: a change after it closes changed
		resp, err := c.cfg.Client.Get(ctx, key)
		if err != nil {
			return DesiredHost{}, fmt.Errorf("etcd get: %w", err)
		}
		if len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision > after || wait == 0 {
			return c.desiredFrom(ctx, host, resp.Kvs)
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return c.desiredFrom(ctx, host, resp.Kvs)
		case <-ctx.Done():
			return DesiredHost{}, ctx.Err()
		}
	}
}

func (c *Controller) desiredFrom(ctx context.Context, host string, kvs []*mvccKV) (DesiredHost, error) {
	if len(kvs) == 0 {
		st, err := c.load(ctx)
		if err != nil {
			return DesiredHost{}, err
		}
		if st.p != nil && st.p.Host(host) == nil {
			return DesiredHost{}, apiErr(http.StatusNotFound, "no host %q in the policy", host)
		}
		return DesiredHost{Host: host, VMs: []string{}, Uplinks: []WireUplink{}, Disks: []WireDisk{}}, nil
	}
	var d DesiredHost
	if err := json.Unmarshal(kvs[0].Value, &d); err != nil {
		return DesiredHost{}, fmt.Errorf("%s: %w", kvs[0].Key, err)
	}
	d.Revision = kvs[0].ModRevision
	return d, nil
}
