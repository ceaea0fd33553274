package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"

	"sluice/entitle"
	"sluice/explain"
	"sluice/placement"
	"sluice/policy"
)

// Error is a request the controller refuses: an HTTP status and a body.
type Error struct {
	Status int
	Body   ErrorBody
}

func (e *Error) Error() string { return e.Body.Error }

func apiErr(status int, format string, args ...any) *Error {
	return &Error{Status: status, Body: ErrorBody{Error: fmt.Sprintf(format, args...)}}
}

// loadPolicy reads the state and fails with 409 when no policy was applied.
func (c *Controller) loadPolicy(ctx context.Context) (*state, error) {
	st, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	if st.p == nil {
		return nil, apiErr(http.StatusConflict, "no policy applied yet (sluice ctl apply -f FILE)")
	}
	return st, nil
}

func reasonOr(given, dflt string) string {
	if given = strings.TrimSpace(given); given != "" {
		return given
	}
	return dflt
}

// Apply validates a policy document (package policy, admission included)
// and makes it the policy in force. VMs with a host in the document run
// there; the others keep running where they run, if their host remains.
func (c *Controller) Apply(ctx context.Context, req ApplyRequest) (Result, error) {
	if req.File == "" {
		req.File = "policy.yaml"
	}
	if err := checkText("reason", req.Reason); err != nil {
		return Result{}, err
	}
	if len(req.File) > 255 || strings.ContainsAny(req.File, "\x00\n\r") {
		return Result{}, apiErr(http.StatusBadRequest, "file: want a file name of one line, at most 255 bytes")
	}
	if len(req.Document) > policy.MaxFileBytes {
		return Result{}, apiErr(http.StatusRequestEntityTooLarge, "%s: larger than %d bytes", req.File, policy.MaxFileBytes)
	}
	p, err := policy.Parse(req.File, []byte(req.Document))
	if err != nil {
		e := apiErr(http.StatusBadRequest, "%s: policy not valid", req.File)
		var errs policy.Errors
		if errors.As(err, &errs) {
			for _, pe := range errs {
				e.Body.Problems = append(e.Body.Problems, pe.Error())
			}
		} else {
			e.Body.Problems = []string{firstLine(err.Error())}
		}
		return Result{}, e
	}
	return c.decide(ctx, false, func(v view) (*next, error) {
		return v.applyDoc(req.File, req.Document, req.Reason, p), nil
	})
}

// faultEvents returns an event for every fault of (p, place) that (op,
// oplace) does not have (op nil: every fault).
func faultEvents(op *policy.Policy, oplace placement.Placement, p *policy.Policy, place placement.Placement) []Event {
	var before []placement.Decision
	if op != nil {
		before = placement.Check(op, oplace, placement.Options{})
	}
	return newFaults(before, placement.Check(p, place, placement.Options{}))
}

// faultEventsOn is faultEvents when only the hosts named in hosts can
// have changed their faults (placement.Change.Hosts): it checks those
// and the cluster-wide quotas (placement.CheckHosts), and returns the
// same events.
func faultEventsOn(hosts []string, op *policy.Policy, oplace placement.Placement, p *policy.Policy, place placement.Placement) []Event {
	return newFaults(placement.CheckHosts(op, oplace, placement.Options{}, hosts), placement.CheckHosts(p, place, placement.Options{}, hosts))
}

// newFaults returns an event for every fault of after that before does
// not have: maxFaultEvents of them, and one that sums up the others.
func newFaults(before, after []placement.Decision) []Event {
	had := map[string]bool{}
	for _, d := range before {
		had[d.Host+"|"+d.Why] = true
	}
	var evs []Event
	for _, d := range after {
		if had[d.Host+"|"+d.Why] {
			continue
		}
		subject := d.Host
		if subject == "" {
			subject = "cluster"
		}
		msg := d.Why
		if len(d.Details) > 0 {
			msg += ": " + strings.Join(d.Details, "; ")
		}
		evs = append(evs, Event{Kind: "fault", Subject: subject, Message: msg, Reason: "reservations no longer fit"})
	}
	if len(evs) > maxFaultEvents {
		hosts := map[string]bool{}
		for _, e := range evs[maxFaultEvents-1:] {
			hosts[e.Subject] = true
		}
		more := len(evs) - maxFaultEvents + 1
		evs = append(evs[:maxFaultEvents-1], Event{Kind: "fault", Subject: "cluster",
			Message: fmt.Sprintf("%d more faults on %d hosts (%s …): sluice ctl get hosts shows each host", more, len(hosts), strings.Join(firstN(sortedKeys(hosts), 5), ", ")),
			Reason:  "reservations no longer fit"})
	}
	return evs
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

// Set makes changes in placement's grammar (TARGET.FIELD=VALUE), all or
// none. A change that breaks a rule no migration can mend is refused (409)
// and recorded as a refusal; one that breaks a host's reservations is
// made, and recorded with the fault and placement's recommended repair.
func (c *Controller) Set(ctx context.Context, req SetRequest) (Result, error) {
	d, err := c.setDecision(req)
	if err != nil {
		return Result{}, err
	}
	return c.decide(ctx, true, d)
}

// setDecision checks a SetRequest and returns its decision (view.set):
// the one that Set commits and WhatIf only runs.
func (c *Controller) setDecision(req SetRequest) (func(v view) (*next, error), error) {
	if len(req.Changes) == 0 {
		return nil, apiErr(http.StatusBadRequest, "no change given")
	}
	if err := checkText("reason", req.Reason); err != nil {
		return nil, err
	}
	for i, spec := range req.Changes {
		if err := checkText(fmt.Sprintf("changes[%d]", i), spec); err != nil {
			return nil, err
		}
	}
	var chs []placement.Change
	for _, spec := range req.Changes {
		ch, err := placement.ParseChange(spec)
		if err != nil {
			return nil, apiErr(http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "usage: "))
		}
		if ch.Sub == "" && ch.Field == "host" {
			return nil, apiErr(http.StatusBadRequest, "change %q: a VM's host changes with power-on or migrate, not set", spec)
		}
		chs = append(chs, ch)
	}
	return func(v view) (*next, error) { return v.set(chs, req.Reason, c.cfg.DRS) }, nil
}

func subjectOf(ch placement.Change) string {
	if ch.Sub != "" {
		return ch.Target + "/" + ch.Sub
	}
	return ch.Target
}

// outcome says what a vNIC change gives: the port's rate with every vNIC's
// demand unbounded, on the uplink it uses.
func outcome(p *policy.Policy, place placement.Placement, ch placement.Change) string {
	if ch.Sub == "" {
		return ""
	}
	// A port VM/NIC is on the trees of the host its VM runs on, a class
	// HOST/CLASS on HOST's: only those are derived.
	hosts := []string{ch.Target}
	if vm := p.VM(ch.Target); vm != nil {
		if h := hostOf(place, vm); h != "" {
			hosts = append(hosts, h)
		}
	}
	n := entitle.NewNet(entitle.DeriveHosts(p, entitle.Live{Hosts: place}, hosts))
	n.Compute()
	ports := n.Port(subjectOf(ch))
	if len(ports) == 0 {
		return ""
	}
	pt := ports[0]
	return fmt.Sprintf(": %s gets %s on %s/%s", pt.Name, entitle.FormatBps(pt.AllocBps()), pt.Host, pt.Uplink)
}

// hostOf is where vm runs in place (nil: the host of the policy), as
// entitle.Derive reads entitle.Live.Hosts.
func hostOf(place placement.Placement, vm *policy.VM) string {
	if place == nil {
		return vm.Host
	}
	return place[vm.Name]
}

// PowerOn places a VM that is off and holds its reservations while it
// starts (view.powerOn). A VM whose reservations fit nowhere (or not on
// the host given) is refused with the reason (409); nothing is written.
func (c *Controller) PowerOn(ctx context.Context, vm string, req PowerOnRequest) (Result, error) {
	if err := checkText("reason", req.Reason); err != nil {
		return Result{}, err
	}
	return c.decide(ctx, true, func(v view) (*next, error) { return v.powerOn(vm, req.Host, req.Reason, c.cfg.ChooseHosts) })
}

// Admit answers whether a domain may start on req.Host (view.admit); an
// admitted VM that was off holds its reservations there while it starts.
func (c *Controller) Admit(ctx context.Context, vm string, req AdmitRequest) (AdmitAnswer, error) {
	if err := checkText("reason", req.Reason); err != nil {
		return AdmitAnswer{}, err
	}
	var ans AdmitAnswer
	_, err := c.decide(ctx, true, func(v view) (*next, error) {
		n, a, err := v.admit(vm, req)
		ans = a
		return n, err
	})
	return ans, err
}

func mustParse(spec string) placement.Change {
	ch, err := placement.ParseChange(spec)
	if err != nil {
		panic(err)
	}
	return ch
}

// Migrate moves a running VM to another host where its reservations fit
// (view.migrate); the destination's agent carries the move out.
func (c *Controller) Migrate(ctx context.Context, vm string, req MigrateRequest) (Result, error) {
	if err := checkText("reason", req.Reason); err != nil {
		return Result{}, err
	}
	return c.decide(ctx, true, func(v view) (*next, error) { return v.migrate(vm, req.To, req.Reason) })
}

// decide runs a decision on the state and the agents' reports and
// commits what it returns (events and decisions recorded even when it
// also returns an error: a refusal that records its reason). Concurrent
// decisions are committed together (group commit): while one commits, the
// ones that arrive wait; the next of them to run takes them all, runs
// each on the state the ones before it left, and commits them in one
// transaction. Each gets its own events and errors; a failed commit fails
// them all, and nothing of theirs is written.
func (c *Controller) decide(ctx context.Context, needPolicy bool, d func(v view) (*next, error)) (Result, error) {
	req := &decideReq{needPolicy: needPolicy, d: d}
	c.qmu.Lock()
	c.queue = append(c.queue, req)
	c.qmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !req.done { // no other caller took it into its batch
		c.qmu.Lock()
		batch := c.queue
		c.queue = nil
		c.qmu.Unlock()
		c.maxBatch = max(c.maxBatch, len(batch))
		bctx := ctx
		if len(batch) > 1 {
			bctx = context.WithoutCancel(ctx) // the others' requests do not end with this one's
		}
		c.decideBatch(bctx, batch)
	}
	return req.res, req.err
}

// decideReq is one decision waiting for its commit; done, res and err are
// written under Controller.mu.
type decideReq struct {
	needPolicy bool
	d          func(v view) (*next, error)
	done       bool
	res        Result
	err        error
}

// decideBatch runs the decisions of batch in order, each on the state the
// ones before left, and commits them in one transaction.
func (c *Controller) decideBatch(ctx context.Context, batch []*decideReq) {
	finish := func(r *decideReq, res Result, err error) { r.res, r.err, r.done = res, err, true }
	old, err := c.load(ctx)
	if err == nil {
		var reports map[string]*Report
		if reports, err = c.reports(ctx); err == nil {
			c.commitBatch(ctx, old, reports, batch)
			return
		}
	}
	for _, r := range batch {
		finish(r, Result{}, err)
	}
}

func (c *Controller) commitBatch(ctx context.Context, old *state, reports map[string]*Report, batch []*decideReq) {
	type made struct {
		r        *decideReq
		n        *next
		from, to int // its events in evs
		rev      int64
		derr     error
	}
	var (
		mades []made
		evs   []Event
		decs  []Decision
	)
	cur := old
	for _, r := range batch {
		n, after, derr := c.run(old, cur, reports, r.needPolicy, r.d)
		if n == nil {
			r.res, r.err, r.done = Result{}, derr, true
			continue
		}
		cur = after
		mades = append(mades, made{r: r, n: n, from: len(evs), to: len(evs) + len(n.events), rev: cur.doc.Revision, derr: derr})
		evs = append(evs, n.events...)
		decs = append(decs, n.decisions...)
	}
	if len(mades) == 0 {
		return
	}
	numbered, err := c.commit(ctx, old, cur, evs, decs)
	if err == nil {
		for _, m := range mades {
			c.met.committed(m.n)
		}
	}
	for _, m := range mades {
		switch {
		case err != nil:
			m.r.res, m.r.err = Result{}, err
		case m.derr != nil:
			m.r.res, m.r.err = Result{}, m.derr
		default:
			m.r.res, m.r.err = Result{Revision: m.rev, Events: numbered[m.from:m.to]}, nil
		}
		m.r.done = true
	}
}

// run runs decision d on cur (made on old, the state read, by the
// decisions before it in a batch) with the agents' reports: the next it
// returns (nil: nothing to write, with derr the refusal or error), and the
// state after it, which commit would write over old. It writes nothing:
// commitBatch commits what it returns, WhatIf only shows it.
func (c *Controller) run(old, cur *state, reports map[string]*Report, needPolicy bool, d func(v view) (*next, error)) (n *next, after *state, derr error) {
	if needPolicy && cur.p == nil {
		return nil, nil, apiErr(http.StatusConflict, "no policy applied yet (sluice ctl apply -f FILE)")
	}
	n, derr = d(c.viewOf(cur, reports))
	if n == nil {
		return nil, nil, derr
	}
	n.events = boundEvents(n.events, n.decisions) // per change, not per batch
	return n, c.chain(old, cur, n), derr
}

// stateOf is the state after n, read as old.
func (c *Controller) stateOf(old *state, n *next) *state {
	return c.chain(old, old, n)
}

// chain is the state after n, made on cur, itself made on old (the state
// read) by the decisions before n in a batch: what commit writes over old.
func (c *Controller) chain(old, cur *state, n *next) *state {
	st := &state{doc: n.doc, p: n.p, place: n.place, history: n.history, starting: n.starting, histChanged: cur.histChanged || n.history != nil}
	if st.history == nil {
		st.history = cur.history
	}
	if st.starting == nil {
		st.starting = cur.starting
	}
	st.extra = slices.Clone(cur.extra)
	for _, d := range n.rewrites {
		st.extra = append(st.extra, c.rewrite(d))
	}
	// The hosts whose part of the policy changed since old: nil when a
	// decision changed it without naming them (every host).
	switch {
	case n.p == cur.p:
		st.scope = cur.scope
	case n.scope == nil || (cur.p != old.p && cur.scope == nil):
		st.scope = nil
	default:
		st.scope = maps.Clone(cur.scope)
		if st.scope == nil {
			st.scope = map[string]bool{}
		}
		maps.Copy(st.scope, n.scope)
	}
	return st
}

// Explain says why a port (VM/NIC, HOST/CLASS) or a disk (VM/DISK) gets
// what it gets, level by level, with the VMs where they hold their
// reservations and every demand unbounded: explain.Lines, the lines
// `sluice explain` prints for the same placement (the network, inbound,
// driver and cpu lines), less those only a host can say.
func (c *Controller) Explain(ctx context.Context, port string) (Explanation, error) {
	st, err := c.loadPolicy(ctx)
	if err != nil {
		return Explanation{}, err
	}
	reports, err := c.reports(ctx)
	if err != nil {
		return Explanation{}, err
	}
	lines, err := explain.Lines(st.p, entitle.Live{Hosts: c.viewOf(st, reports).holding()}, port, explain.Options{})
	if errors.Is(err, explain.ErrNoSuchPort) {
		return Explanation{}, apiErr(http.StatusNotFound, "%s: no such port or disk (VM/NIC of a running VM, HOST/CLASS, VM/DISK)", port)
	}
	if err != nil {
		return Explanation{}, err
	}
	return Explanation{Port: port, Lines: lines}, nil
}

// VMs lists the VMs of the policy: where each should run (desired),
// where it runs (observed), its state and what its vNICs get among the
// VMs that hold reservations.
func (c *Controller) VMs(ctx context.Context) ([]VMInfo, error) {
	st, err := c.load(ctx)
	if err != nil || st.p == nil {
		return []VMInfo{}, err
	}
	reports, err := c.reports(ctx)
	if err != nil {
		return nil, err
	}
	v := c.viewOf(st, reports)
	n := entitle.NewNet(entitle.Derive(st.p, entitle.Live{Hosts: v.holding()}))
	n.Compute()
	out := []VMInfo{}
	for i := range st.p.VMs {
		vm := &st.p.VMs[i]
		vi := v.vmInfo(vm)
		for _, nic := range vm.NICs {
			ni := NICInfo{Port: policy.PortName(vm.Name, nic.Name), ReservationBps: float64(nic.Reservation), Shares: float64(nic.Shares),
				LimitBps: limitPtr(entitle.RateLimit(nic.Limit))}
			if pts := n.Port(ni.Port); len(pts) > 0 {
				ni.Uplink, ni.AllocBps = pts[0].Host+"/"+pts[0].Uplink, pts[0].AllocBps()
			}
			vi.NICs = append(vi.NICs, ni)
		}
		out = append(out, vi)
	}
	return out, nil
}

// Policy returns the stored policy: the document and the changes since.
func (c *Controller) Policy(ctx context.Context) (PolicyState, error) {
	st, err := c.loadPolicy(ctx)
	if err != nil {
		return PolicyState{}, err
	}
	return st.doc, nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
