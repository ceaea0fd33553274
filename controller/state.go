// Package controller keeps a sluice cluster's state in etcd and serves the
// API that `sluice ctl` and the agents speak (api/openapi.yaml): the policy
// and every change made to it, where VMs run, the hosts that registered,
// each host's desired state, decisions and events. It decides with the
// pure packages (policy, placement, entitle) and records each decision with
// its reason; it does not touch the hosts itself. See docs/controller.md.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/placement"
	"sluice/policy"
)

// Config configures a Controller.
type Config struct {
	// Client is the etcd client (OpenEtcd).
	Client *clientv3.Client
	// Prefix is the key prefix of the cluster's state; "" means "/sluice/".
	Prefix string
	// ChooseHosts turns placement on: a power-on without a host goes
	// where placement.Plan puts it. Off: it goes to the policy's host.
	ChooseHosts bool
	// HostTTLSeconds is the lease of a registered host; 0 means 10.
	HostTTLSeconds int64
	// DRS says what becomes of placement's repairs and rebalancing moves:
	// DRSManual (the default) records them as recommended decisions that
	// Approve carries out; DRSAutomatic carries them out at once.
	DRS DRSMode
	// RebalanceThreshold is placement's migration threshold of the
	// periodic pass (RunDRS): 1 repairs faults only, 2..5 also rebalance,
	// more and more eagerly; 0 means 1.
	RebalanceThreshold int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxEvents is how many events are kept (each change deletes the
	// oldest beyond it); 0 means DefaultMaxEvents.
	MaxEvents int
	// MaxDecisions is how many decisions Prune keeps at most, besides
	// those pending or under way; 0 means DefaultMaxDecisions.
	MaxDecisions int
	// EventTTL is the age from which Prune deletes events and decisions
	// not under way; 0 means DefaultEventTTL.
	EventTTL time.Duration
}

// Controller serves the cluster state. Its methods are safe for concurrent
// use; changes are serialized and each is one etcd transaction that fails
// when another writer changed the state since it was read.
type Controller struct {
	cfg Config
	mu  sync.Mutex // serializes changes
	// queue holds the decisions waiting for the next group commit
	// (decide).
	qmu      sync.Mutex
	queue    []*decideReq
	maxBatch int // the most decisions committed together (under mu)
	// cache is the last state read or written: its document, policy and
	// placement are reused while their keys' mod revisions hold.
	cacheMu sync.Mutex
	cache   *state
	hub     desiredHub  // the agents' long polls of their desired state
	rep     reportCache // the agents' reports (observed state)
	// names is the set of VM names of the policy namesOf (vmNames).
	namesMu sync.Mutex
	namesOf *policy.Policy
	names   map[string]bool
	met     *metrics    // what it counts for Prometheus (Collector)
	hist    rateHistory // each report's measured rates and entitlements (history.go)
}

// Key names under the prefix (docs/controller.md, "State in etcd").
const (
	keyPolicy    = "state/policy"    // PolicyState
	keyPlacement = "state/placement" // VM → host of the running VMs
	keySeq       = "state/seq"       // the last event or decision number
	keyHistory   = "state/history"   // VM → its last migration carried out (placement.LastMove)
	keyStarting  = "state/starting"  // VM → Start: placed, not yet observed there
	dirHosts     = "hosts/"          // hosts/NAME: a registered host's Report, under its lease
	dirDesired   = "desired/"        // desired/NAME: a host's DesiredHost (Revision 0)
	dirEvents    = "events/"         // events/%020d: Event
	dirDecisions = "decisions/"      // decisions/%020d: Decision
)

// New returns a controller on the etcd client of cfg.
func New(cfg Config) *Controller {
	if cfg.Prefix == "" {
		cfg.Prefix = "/sluice/"
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.HostTTLSeconds <= 0 {
		cfg.HostTTLSeconds = 10
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DRS == "" {
		cfg.DRS = DRSManual
	}
	if cfg.RebalanceThreshold <= 0 {
		cfg.RebalanceThreshold = 1
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.MaxDecisions <= 0 {
		cfg.MaxDecisions = DefaultMaxDecisions
	}
	if cfg.EventTTL <= 0 {
		cfg.EventTTL = DefaultEventTTL
	}
	return &Controller{cfg: cfg, met: newMetrics()}
}

func (c *Controller) key(name string) string { return c.cfg.Prefix + name }

// state is the cluster's state as read at some etcd revision.
type state struct {
	doc   PolicyState
	p     *policy.Policy // nil before the first apply
	place placement.Placement
	seq   int64
	// history is each VM's last migration carried out, so that
	// rebalancing never undoes itself (placement.Options.History). It is
	// kept in etcd with the placement: a restarted controller (also after
	// kill -9) neither repeats nor reverts a move. A new state leaves it
	// nil unless it carries a move out (withMove); commit writes it then.
	history map[string]placement.LastMove
	// histChanged says that history is new: commit writes it.
	histChanged bool
	// starting are the VMs placed by a power-on, an apply or a move and
	// not yet observed there (view.holding). Like history, nil in a new
	// state means unchanged; commit writes it when set.
	starting map[string]Start
	// The mod revisions of the keys read, for the commit's comparison.
	policyRev, placeRev, seqRev, startRev int64
	// readRev is the store's revision the state was read at (or written
	// at, after a commit): remember keeps the newest.
	readRev int64
	// extra are further writes of the commit (a decision's new status).
	extra []clientv3.Op
	// scope names the hosts whose part of the policy can differ from the
	// state read before (next.scope); nil with another policy: every
	// host. Commit publishes those and the hosts whose placed, starting
	// or moving VMs changed.
	scope map[string]bool
}

// load reads the state. The document and the placement (megabytes in a
// large cluster) are read and decoded only when their keys changed since
// the last read, and the policy rebuilt (document plus changes) only when
// the document changed. The state's place may be shared with later
// loads: clone it before changing it.
func (c *Controller) load(ctx context.Context) (*state, error) {
	keys, err := c.cfg.Client.Get(ctx, c.key("state/"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd get: %w", err)
	}
	st := &state{place: placement.Placement{}, readRev: keys.Header.Revision}
	var histRev int64
	for _, kv := range keys.Kvs {
		switch strings.TrimPrefix(string(kv.Key), c.cfg.Prefix) {
		case keyPolicy:
			st.policyRev = kv.ModRevision
		case keyPlacement:
			st.placeRev = kv.ModRevision
		case keySeq:
			st.seqRev = kv.ModRevision
		case keyHistory:
			histRev = kv.ModRevision
		case keyStarting:
			st.startRev = kv.ModRevision
		}
	}
	c.cacheMu.Lock()
	cached := c.cache
	c.cacheMu.Unlock()
	// read decodes key's value at the revision of the keys read.
	read := func(name string, rev int64, v any) error {
		if rev == 0 {
			return nil
		}
		resp, err := c.cfg.Client.Get(ctx, c.key(name), clientv3.WithRev(keys.Header.Revision))
		if err != nil {
			return fmt.Errorf("etcd get: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%s%s: gone at revision %d", c.cfg.Prefix, name, keys.Header.Revision)
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
			return fmt.Errorf("%s: %w", resp.Kvs[0].Key, err)
		}
		return nil
	}
	if err := read(keySeq, st.seqRev, &st.seq); err != nil {
		return nil, err
	}
	if err := read(keyHistory, histRev, &st.history); err != nil {
		return nil, err
	}
	if cached != nil && cached.startRev == st.startRev {
		st.starting = cached.starting
	} else if err := read(keyStarting, st.startRev, &st.starting); err != nil {
		return nil, err
	}
	if cached != nil && cached.placeRev == st.placeRev {
		st.place = cached.place
	} else if err := read(keyPlacement, st.placeRev, &st.place); err != nil {
		return nil, err
	}
	if st.policyRev == 0 {
		return st, nil
	}
	if cached != nil && cached.policyRev == st.policyRev && cached.p != nil {
		st.doc, st.p = cached.doc, cached.p
	} else {
		if err := read(keyPolicy, st.policyRev, &st.doc); err != nil {
			return nil, err
		}
		if st.p, err = rebuild(st.doc, st.place); err != nil {
			return nil, err
		}
		c.met.decodes.Inc()
	}
	c.remember(st)
	return st, nil
}

// remember makes st the state later loads reuse (its document, policy
// and placement, by their mod revisions), unless the state remembered is
// newer: a load that read before a commit and ends after it would
// otherwise put back what the commit replaced, and every load after it
// would decode the policy again.
func (c *Controller) remember(st *state) {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	if c.cache != nil && c.cache.readRev > st.readRev {
		return
	}
	c.cache = &state{doc: st.doc, p: st.p, place: st.place, starting: st.starting, policyRev: st.policyRev, placeRev: st.placeRev, startRev: st.startRev, readRev: st.readRev}
}

// rebuild decodes the stored document and makes its changes again.
func rebuild(doc PolicyState, place placement.Placement) (*policy.Policy, error) {
	p, err := policy.Decode(doc.File, []byte(doc.Document))
	if err != nil {
		return nil, fmt.Errorf("stored policy revision %d: %s", doc.Revision, firstLine(err.Error()))
	}
	for _, spec := range doc.Changes {
		ch, err := placement.ParseChange(spec)
		if err != nil {
			return nil, fmt.Errorf("stored change %q: %v", spec, err)
		}
		np, _, err := ch.Apply(p, place)
		if err != nil {
			return nil, fmt.Errorf("stored change %q no longer applies: %v", spec, err)
		}
		p = np
	}
	return p, nil
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// commit writes the new state st (read as old), appends evs and decs
// (numbered here) and publishes every host's desired state that changed,
// in one transaction. It fails with errConflict when the state changed
// since old was read.
func (c *Controller) commit(ctx context.Context, old, st *state, evs []Event, decs []Decision) ([]Event, error) {
	now := c.cfg.Now().UTC()
	if st.starting == nil {
		st.starting = old.starting
	}
	var ops []clientv3.Op
	put := func(k string, v any, o ...clientv3.OpOption) {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err) // our own types always marshal
		}
		ops = append(ops, clientv3.OpPut(c.key(k), string(b), o...))
	}
	wrotePolicy := st.doc.Revision != old.doc.Revision
	if wrotePolicy {
		put(keyPolicy, st.doc)
	}
	samePlace := sameMap(st.place, old.place) || maps.Equal(st.place, old.place)
	if !samePlace {
		put(keyPlacement, st.place) // ~25 bytes a VM: not rewritten with every event
	}
	st.seq = old.seq
	for i := range decs {
		st.seq++
		decs[i].Seq, decs[i].Time = st.seq, now
		put(fmt.Sprintf("%s%020d", dirDecisions, st.seq), decs[i])
	}
	for i := range evs {
		st.seq++
		evs[i].Seq, evs[i].Time = st.seq, now
		put(fmt.Sprintf("%s%020d", dirEvents, st.seq), evs[i])
	}
	put(keySeq, st.seq)
	if len(evs) > 0 {
		if op, ok := c.trimEventsOp(st.seq); ok {
			ops = append(ops, op)
		}
	}
	if st.history != nil && st.histChanged {
		put(keyHistory, st.history)
	}
	sameStarting := sameMap(st.starting, old.starting) || maps.Equal(st.starting, old.starting)
	if !sameStarting {
		put(keyStarting, st.starting)
	}
	ops = append(ops, st.extra...)
	if st.p != old.p || !samePlace || !sameStarting {
		// The desired states derive from the policy, the placement and
		// the moves under way only: a commit that changes none of them
		// (an event, a decision's status) leaves them as published.
		pub, err := c.publishOps(ctx, st, publishScope(old, st))
		if err != nil {
			return nil, err
		}
		ops = append(ops, pub...)
	}
	cmp := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(c.key(keyPolicy)), "=", old.policyRev),
		clientv3.Compare(clientv3.ModRevision(c.key(keyPlacement)), "=", old.placeRev),
		clientv3.Compare(clientv3.ModRevision(c.key(keySeq)), "=", old.seqRev),
	}
	resp, err := c.cfg.Client.Txn(ctx).If(cmp...).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd txn: %w%s", err, txnHint(err))
	}
	if !resp.Succeeded {
		return nil, errConflict
	}
	// The keys not written keep the revisions read: a state made by a
	// decision (chain) starts with none, and a cache without the policy's
	// revision would make the next load decode the policy again.
	st.policyRev, st.placeRev, st.startRev = old.policyRev, old.placeRev, old.startRev
	if wrotePolicy {
		st.policyRev = resp.Header.Revision
	}
	if !samePlace {
		st.placeRev = resp.Header.Revision
	}
	if !sameStarting {
		st.startRev = resp.Header.Revision
	}
	st.readRev = resp.Header.Revision
	if (wrotePolicy || !samePlace || !sameStarting) && st.p != nil {
		c.remember(st) // the next read reuses them without decoding
	}
	return evs, nil
}

// sameMap tells whether a and b are the same map (not a copy): a decision
// that changes nothing passes its view's maps on, and comparing 30,000
// entries to find that out costs more than the rest of a registration.
func sameMap[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

var errConflict = errors.New("the cluster state changed during the request (another controller?); try again")

// publishScope names the hosts whose desired state can differ between
// old and st (nil: every host): the hosts st.scope names when the policy
// changed within them, and the hosts a VM was placed on, started or moved
// to or from, before or after.
func publishScope(old, st *state) map[string]bool {
	if old.p == nil || (st.p != old.p && st.scope == nil) || len(st.p.Hosts) != len(old.p.Hosts) {
		return nil
	}
	hosts := map[string]bool{}
	if st.p != old.p {
		maps.Copy(hosts, st.scope)
	}
	if !sameMap(st.place, old.place) {
		for vm, h := range st.place {
			if o := old.place[vm]; o != h {
				hosts[h], hosts[o] = true, true
			}
		}
		for vm, o := range old.place {
			if _, ok := st.place[vm]; !ok {
				hosts[o] = true
			}
		}
	}
	if !sameMap(st.starting, old.starting) {
		for vm, s := range st.starting {
			if o, ok := old.starting[vm]; !ok || o != s {
				hosts[s.Host], hosts[o.Host] = true, true
			}
		}
		for vm, o := range old.starting {
			if _, ok := st.starting[vm]; !ok {
				hosts[o.Host] = true
			}
		}
	}
	delete(hosts, "")
	return hosts
}

// publishOps returns the puts of the desired states of the hosts in only
// (nil: every host) that differ from what is published, and the deletes
// of hosts no longer in the policy (only nil).
func (c *Controller) publishOps(ctx context.Context, st *state, only map[string]bool) ([]clientv3.Op, error) {
	if st.p == nil {
		return nil, nil
	}
	have := map[string]string{}
	if only == nil {
		resp, err := c.cfg.Client.Get(ctx, c.key(dirDesired), clientv3.WithPrefix())
		if err != nil {
			return nil, fmt.Errorf("etcd get: %w", err)
		}
		for _, kv := range resp.Kvs {
			have[strings.TrimPrefix(string(kv.Key), c.key(dirDesired))] = string(kv.Value)
		}
	} else {
		for h := range only {
			resp, err := c.cfg.Client.Get(ctx, c.key(dirDesired+h))
			if err != nil {
				return nil, fmt.Errorf("etcd get: %w", err)
			}
			for _, kv := range resp.Kvs {
				have[h] = string(kv.Value)
			}
		}
	}
	byHost := desiredOf(st.p, st.place, st.starting, only)
	var ops []clientv3.Op
	for _, h := range st.p.Hosts {
		if only != nil && !only[h.Name] {
			continue
		}
		dh := emptyDesired(h.Name)
		if p := byHost[h.Name]; p != nil {
			dh = *p
		}
		b, err := json.Marshal(dh)
		if err != nil {
			return nil, fmt.Errorf("desired state of %s: %w", h.Name, err)
		}
		if have[h.Name] != string(b) {
			ops = append(ops, clientv3.OpPut(c.key(dirDesired+h.Name), string(b)))
		}
		delete(have, h.Name)
	}
	for h := range have {
		if only == nil {
			ops = append(ops, clientv3.OpDelete(c.key(dirDesired+h)))
		}
	}
	return ops, nil
}

// Republish rewrites every host's desired state that differs from what
// this controller renders from the stored state (one written by another
// version of sluice, e.g. without the host's part of the policy, or never
// written) and returns how many it rewrote. A controller runs it at start,
// so that an upgrade reaches the agents without a change to the policy.
func (c *Controller) Republish(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.load(ctx)
	if err != nil || st.p == nil {
		return 0, err
	}
	ops, err := c.publishOps(ctx, st, nil)
	if err != nil || len(ops) == 0 {
		return 0, err
	}
	resp, err := c.cfg.Client.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(c.key(keyPolicy)), "=", st.policyRev),
		clientv3.Compare(clientv3.ModRevision(c.key(keyPlacement)), "=", st.placeRev),
		clientv3.Compare(clientv3.ModRevision(c.key(keySeq)), "=", st.seqRev),
	).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd txn: %w%s", err, txnHint(err))
	}
	if !resp.Succeeded {
		return 0, errConflict
	}
	return len(ops), nil
}
