package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/internal/clock"
	"sluice/placement"
	"sluice/policy"
)

// The cluster as it is: the controller's decisions read the desired
// state (the policy and where each VM is placed) beside what the agents
// observe (which VMs their hypervisors run). Reservations are held by the
// VMs that run (observed), that are starting or migrating (a power-on or a
// move decided less than its grace ago), and by the placed VMs of hosts
// that have no agent (nobody can tell: they are assumed to hold); a VM
// placed on a host whose agent does not report it is off and holds
// nothing.

// StartGrace is how long a power-on (or an apply's placement) holds the
// VM's reservations on its host before its agent reports it running;
// MoveGrace the same for a migration (a live migration may take minutes).
const (
	StartGrace = 2 * time.Minute
	MoveGrace  = 6 * time.Minute
)

// Start is a VM placed on Host at AtNs (Unix ns) and not yet observed
// there: a power-on, an apply's placement, or a move (Move).
type Start struct {
	Host string `json:"host"`
	AtNs int64  `json:"at_ns"`
	Move bool   `json:"move,omitempty"`
	From string `json:"from,omitempty"` // a move's source: the host that runs the VM
}

// grace is how long s holds.
func (s Start) grace() time.Duration {
	if s.Move {
		return MoveGrace
	}
	return StartGrace
}

// view is what the decisions read. It is pure data: decisions on it do
// no I/O and read no clock (NowNs).
type view struct {
	doc     PolicyState
	p       *policy.Policy
	history map[string]placement.LastMove
	place   placement.Placement // desired: where each placed VM should run
	// obs is which host runs each VM of the policy (observation); agents
	// are the hosts whose agent reports (a live lease).
	obs      *observation
	agents   map[string]bool
	starting map[string]Start
	reports  map[string]*Report // by host: the registered agents' last reports
	known    map[string]bool    // the policy's VM names
	nowNs    int64
}

// live is whether s still holds at nowNs.
func (v view) live(s Start) bool { return v.nowNs-s.AtNs < int64(s.grace()) }

// holding is where each VM holds its reservations now: a VM starting or
// moving at its destination, a running VM where it runs, a placed VM of a
// host without an agent on that host; off VMs are absent.
func (v view) holding() placement.Placement {
	out := placement.Placement{}
	for vm, h := range v.place {
		if s, ok := v.starting[vm]; ok && s.Host == h && v.live(s) {
			out[vm] = h
		} else if o := v.runsOn(vm); o != "" {
			out[vm] = o
		} else if !v.agents[h] {
			out[vm] = h
		}
	}
	for vm, h := range v.observed() {
		if _, ok := out[vm]; !ok {
			out[vm] = h // runs although not placed (started outside sluice)
		}
	}
	return out
}

// state says what a VM is: unknown (placed on a host without an agent,
// and no agent reports it), moving or starting (decided, not yet observed
// where it should be), running (observed), or off (placed or not, no
// agent reports it).
func (v view) state(vm string) (string, time.Time) {
	h, o := v.place[vm], v.runsOn(vm)
	s, ok := v.starting[vm]
	switch {
	case h != "" && !v.agents[h] && o == "":
		return "unknown", time.Time{}
	case ok && s.Host == h && v.live(s) && o != h:
		if s.Move {
			return "moving", time.Unix(0, s.AtNs).UTC()
		}
		return "starting", time.Unix(0, s.AtNs).UTC()
	case o != "":
		return "running", v.obs.get().since[vm]
	}
	return "off", time.Time{}
}

// settled returns the starting entries that no longer hold: observed
// where they were decided, or past their grace (then the VM did not
// start or arrive: an event says its reservations are released).
func (v view) settled() (done []string, expired []Event) {
	for _, vm := range sortedKeys(v.starting) {
		s := v.starting[vm]
		switch {
		case v.runsOn(vm) == s.Host || v.place[vm] != s.Host:
			done = append(done, vm)
		case !v.live(s):
			done = append(done, vm)
			what := "start"
			if s.Move {
				what = "arrive"
			}
			expired = append(expired, Event{Kind: "off", Subject: vm,
				Message: vm + " did not " + what + " on " + s.Host + " within " + s.grace().String() + ": it holds no reservation until it runs",
				Reason:  "not reported by the agent of " + s.Host})
		}
	}
	return done, expired
}

// reports returns the agents' reports (hosts/, under their leases), by
// host, from the controller's cache of them (reportCache: one etcd watch
// keeps it current; a report this controller stores is in it at once).
func (c *Controller) reports(ctx context.Context) (map[string]*Report, error) {
	return c.rep.snapshot(ctx, c.cfg.Client, c.key(dirHosts))
}

// reportCache is every registered host's last report, kept by one etcd
// watch of hosts/ (reports come and go with the agents' leases): a
// decision reads the cluster as observed without reading every report
// from etcd (with 1,000 hosts, that was most of a registration's time).
type reportCache struct {
	once  sync.Once
	ready chan struct{}
	err   error
	mu    sync.Mutex
	m     map[string]*Report
	// rev is the etcd revision of what m holds for each host (its put or
	// delete): a watch event older than a report put directly does not
	// replace it.
	rev map[string]int64
}

// snapshot returns a copy of the cache (the reports themselves are
// shared: never change them), starting the watch at the first call.
func (rc *reportCache) snapshot(ctx context.Context, cli *clientv3.Client, prefix string) (map[string]*Report, error) {
	rc.once.Do(func() {
		rc.ready = make(chan struct{})
		go rc.run(cli, prefix)
	})
	select {
	case <-rc.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.err != nil {
		return nil, rc.err
	}
	out := make(map[string]*Report, len(rc.m))
	maps.Copy(out, rc.m)
	return out, nil
}

// put records host's report as stored at revision rev.
func (rc *reportCache) put(host string, r *Report, rev int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m != nil && rev > rc.rev[host] {
		rc.m[host], rc.rev[host] = r, rev
	}
}

// event takes a watch event of host's report (a put of value, or a
// delete) at revision rev, unless the cache holds a later one (a put that
// the watch has not delivered yet came first).
func (rc *reportCache) event(host string, rev int64, deleted bool, value []byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m == nil || rev <= rc.rev[host] {
		return
	}
	rc.rev[host] = rev
	if deleted {
		delete(rc.m, host)
		return
	}
	var r Report
	if json.Unmarshal(value, &r) == nil {
		rc.m[host] = &r
	}
}

// load reads every report and returns the revision they were read at.
func (rc *reportCache) load(cli *clientv3.Client, prefix string) (int64, error) {
	ctx, cancel := context.WithTimeout(cli.Ctx(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("etcd get: %w", err)
	}
	m, revs := map[string]*Report{}, map[string]int64{}
	for _, kv := range resp.Kvs {
		var r Report
		if json.Unmarshal(kv.Value, &r) == nil {
			host := strings.TrimPrefix(string(kv.Key), prefix)
			m[host], revs[host] = &r, kv.ModRevision
		}
	}
	rc.mu.Lock()
	rc.m, rc.rev, rc.err = m, revs, nil
	rc.mu.Unlock()
	return resp.Header.Revision, nil
}

func (rc *reportCache) run(cli *clientv3.Client, prefix string) {
	first := true
	for cli.Ctx().Err() == nil {
		rev, err := rc.load(cli, prefix)
		if first {
			if err != nil {
				rc.mu.Lock()
				rc.err = err
				rc.mu.Unlock()
			}
			close(rc.ready)
			first = false
		}
		if err != nil {
			if !clock.SleepCtx(cli.Ctx(), time.Second) {
				return
			}
			continue
		}
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(cli.Ctx()))
		for wr := range cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				rc.event(strings.TrimPrefix(string(ev.Kv.Key), prefix), ev.Kv.ModRevision, ev.Type == clientv3.EventTypeDelete, ev.Kv.Value)
			}
		}
		cancel()
		// The watch ended (no leader, compaction): read everything again.
		if !clock.SleepCtx(cli.Ctx(), 100*time.Millisecond) {
			return
		}
	}
}

// vmNames is the set of p's VM names, computed once per policy.
func (c *Controller) vmNames(p *policy.Policy) map[string]bool {
	c.namesMu.Lock()
	defer c.namesMu.Unlock()
	if p != nil && p == c.namesOf {
		return c.names
	}
	m := map[string]bool{}
	if p != nil {
		for i := range p.VMs {
			m[p.VMs[i].Name] = true
		}
	}
	c.namesOf, c.names = p, m
	return m
}

// named is r with the domains of r.Unnamed that the policy names (known,
// by their name or by the UUID the agent reports for them) moved to r.VMs
// under the policy's name: a host's agent knows only the VMs of its part
// of the policy, so a VM placed elsewhere that runs on the host comes as
// an unnamed domain.
func named(r Report, known map[string]bool) Report {
	var vms, unnamed []string
	for _, d := range r.Unnamed {
		vm := ""
		if known[d] {
			vm = d
		} else if u := r.UUIDs[d]; u != "" {
			for _, name := range []string{u, strings.ToLower(u), strings.ToUpper(u)} {
				if known[name] {
					vm = name
					break
				}
			}
		}
		if vm == "" {
			unnamed = append(unnamed, d)
		} else if !slices.Contains(r.VMs, vm) {
			vms = append(vms, vm)
		}
	}
	if len(vms) == 0 {
		return r
	}
	r.VMs = append(slices.Clone(r.VMs), vms...)
	sort.Strings(r.VMs)
	r.Unnamed = unnamed
	return r
}

// viewOf is the view of state st with the agents' reports.
func (c *Controller) viewOf(st *state, reports map[string]*Report) view {
	v := view{doc: st.doc, p: withMeasured(st.p, reports), history: st.history, place: st.place, starting: st.starting, nowNs: c.cfg.Now().UnixNano(),
		agents: map[string]bool{}, reports: reports, known: c.vmNames(st.p)}
	for h := range reports {
		v.agents[h] = true
	}
	v.obs = &observation{reports: reports, place: st.place, known: v.known}
	return v
}

// withMeasured returns p with each datastore's MeasuredIOPS from the
// hosts' reports: the least any host measured (the slowest view counts),
// none where none did (policy.Policy.WithMeasuredIOPS). Admission counts
// it where the file declares no capacity (policy.Datastore.IOPSQuota).
func withMeasured(p *policy.Policy, reports map[string]*Report) *policy.Policy {
	if p == nil || len(p.Datastores) == 0 {
		return p
	}
	var least map[string]float64
	for _, r := range reports {
		for ds, v := range r.CapacityIOPS {
			if v >= 1 && (least[ds] == 0 || v < least[ds]) {
				if least == nil {
					least = map[string]float64{}
				}
				least[ds] = v
			}
		}
	}
	return p.WithMeasuredIOPS(least)
}

// observation is which host runs each VM, by the reports, built at its
// first use: a decision that asks for a few VMs only (a registration, at
// 30,000 VMs) does not pay for the whole cluster.
type observation struct {
	once     sync.Once
	reports  map[string]*Report
	place    placement.Placement
	known    map[string]bool
	observed map[string]string    // VM → the host whose agent reports it running
	since    map[string]time.Time // VM → when that agent first saw it
}

func (o *observation) get() *observation {
	o.once.Do(func() {
		if o.observed != nil {
			return // given (withObserved)
		}
		o.observed, o.since = map[string]string{}, map[string]time.Time{}
		for _, h := range sortedKeys(o.reports) {
			r := o.reports[h]
			for _, vm := range r.VMs {
				if !o.known[vm] {
					continue
				}
				// Two hosts report a VM for a moment while it migrates:
				// the one it is placed on wins.
				if cur := o.observed[vm]; cur == "" || h == o.place[vm] {
					o.observed[vm] = h
					o.since[vm] = r.Since[vm]
				}
			}
		}
	})
	return o
}

// observed is VM → the host whose agent reports it running (read only).
func (v view) observed() map[string]string { return v.obs.get().observed }

// runsOn is the host whose agent reports vm running, "" when none.
func (v view) runsOn(vm string) string { return v.obs.get().observed[vm] }

// withObserved is v with observed in place of the reports' view of it.
func (v view) withObserved(observed map[string]string) view {
	w := v
	w.obs = &observation{observed: observed, since: v.obs.get().since}
	return w
}
