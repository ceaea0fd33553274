package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"sluice/entitle"
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
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.load(ctx)
	if err != nil {
		return Result{}, err
	}
	st := &state{p: p, place: placement.Placement{},
		doc: PolicyState{Revision: old.doc.Revision + 1, File: req.File, Document: req.Document, AppliedAt: c.cfg.Now().UTC()}}
	for _, v := range p.VMs {
		if v.Host != "" {
			st.place[v.Name] = v.Host
		} else if h := old.place[v.Name]; h != "" && p.Host(h) != nil {
			st.place[v.Name] = h
		}
	}
	evs := []Event{{Kind: "apply", Subject: req.File,
		Message: fmt.Sprintf("policy revision %d: %d hosts, %d VMs, %d running", st.doc.Revision, len(p.Hosts), len(p.VMs), len(st.place)),
		Reason:  reasonOr(req.Reason, "policy applied")}}
	evs = append(evs, faultEvents(nil, nil, p, st.place)...)
	evs, err = c.commit(ctx, old, st, evs, nil)
	if err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
}

// faultEvents returns an event for every fault of (p, place) that (op,
// oplace) does not have (op nil: every fault).
func faultEvents(op *policy.Policy, oplace placement.Placement, p *policy.Policy, place placement.Placement) []Event {
	before := map[string]bool{}
	if op != nil {
		for _, d := range placement.Check(op, oplace, placement.Options{}) {
			before[d.Host+"|"+d.Why] = true
		}
	}
	var evs []Event
	for _, d := range placement.Check(p, place, placement.Options{}) {
		if before[d.Host+"|"+d.Why] {
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
	return evs
}

// Set makes changes in placement's grammar (TARGET.FIELD=VALUE), all or
// none. A change that breaks a rule no migration can mend is refused (409)
// and recorded as a refusal; one that breaks a host's reservations is
// made, and recorded with the fault and placement's recommended repair.
func (c *Controller) Set(ctx context.Context, req SetRequest) (Result, error) {
	if len(req.Changes) == 0 {
		return Result{}, apiErr(http.StatusBadRequest, "no change given")
	}
	var chs []placement.Change
	for _, spec := range req.Changes {
		ch, err := placement.ParseChange(spec)
		if err != nil {
			return Result{}, apiErr(http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "usage: "))
		}
		if ch.Sub == "" && ch.Field == "host" {
			return Result{}, apiErr(http.StatusBadRequest, "change %q: a VM's host changes with power-on or migrate, not set", spec)
		}
		chs = append(chs, ch)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.loadPolicy(ctx)
	if err != nil {
		return Result{}, err
	}
	p, place := old.p, old.place
	var changed []string
	for _, ch := range chs {
		np, npl, err := ch.Apply(p, place)
		var re *placement.RefusedError
		if errors.As(err, &re) {
			ev := Event{Kind: "refuse", Subject: subjectOf(ch), Message: fmt.Sprintf("change %s refused: %s", ch.Spec, re.Reason),
				Reason: reasonOr(req.Reason, "requested through the API")}
			_, _ = c.commit(ctx, old, &state{doc: old.doc, p: old.p, place: old.place}, []Event{ev}, nil)
			return Result{}, apiErr(http.StatusConflict, "%s", re.Error())
		}
		if err != nil {
			return Result{}, apiErr(http.StatusBadRequest, "%v", err)
		}
		p, place = np, npl
		if vm := ch.VM(p); vm != "" {
			changed = append(changed, vm)
		}
	}
	st := &state{p: p, place: place, doc: old.doc}
	st.doc.Revision++
	st.doc.Changes = append(append([]string(nil), old.doc.Changes...), req.Changes...)
	st.doc.AppliedAt = c.cfg.Now().UTC()
	var evs []Event
	for _, ch := range chs {
		evs = append(evs, Event{Kind: "set", Subject: subjectOf(ch), Message: ch.Spec + outcome(p, place, ch),
			Reason: reasonOr(req.Reason, "requested through the API")})
	}
	faults := faultEvents(old.p, old.place, p, place)
	evs = append(evs, faults...)
	var decs []Decision
	if len(faults) > 0 {
		r := placement.Plan(p, place, placement.Demand{}, placement.Options{Threshold: 1, Changed: changed})
		st.place = clonePlace(place)
		var mevs []Event
		decs, mevs = c.plannedMoves(r.Moves(), old, st)
		evs = append(evs, mevs...)
	}
	evs, err = c.commit(ctx, old, st, evs, decs)
	if err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
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
	n := entitle.NewNet(entitle.Derive(p, entitle.Live{Hosts: place}))
	n.Compute()
	ports := n.Port(subjectOf(ch))
	if len(ports) == 0 {
		return ""
	}
	pt := ports[0]
	return fmt.Sprintf(": %s gets %s on %s/%s", pt.Name, entitle.FormatBps(pt.AllocBps()), pt.Host, pt.Uplink)
}

// PowerOn starts a VM that is off: on the host given, else (placement on)
// where placement.Plan puts it, else on its policy host. A VM whose
// reservations fit nowhere (or not on the host given) is refused with the
// reason (409), and the refusal is recorded.
func (c *Controller) PowerOn(ctx context.Context, vm string, req PowerOnRequest) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.loadPolicy(ctx)
	if err != nil {
		return Result{}, err
	}
	v := old.p.VM(vm)
	if v == nil {
		return Result{}, apiErr(http.StatusNotFound, "no VM %q in the policy", vm)
	}
	if h := old.place[vm]; h != "" {
		return Result{}, apiErr(http.StatusConflict, "%s is already running on %s", vm, h)
	}
	reason := reasonOr(req.Reason, "requested through the API")
	refuse := func(why string, details []string) (Result, error) {
		msg := why
		if len(details) > 0 {
			msg += ": " + strings.Join(details, "; ")
		}
		ev := Event{Kind: "refuse", Subject: vm, Message: "power-on refused: " + msg, Reason: reason}
		_, _ = c.commit(ctx, old, &state{doc: old.doc, p: old.p, place: old.place}, []Event{ev}, nil)
		e := apiErr(http.StatusConflict, "power-on %s refused: %s", vm, why)
		e.Body.Details = details
		return Result{}, e
	}
	host, why := req.Host, ""
	if host == "" && !c.cfg.ChooseHosts {
		host = v.Host
		if host == "" {
			return Result{}, apiErr(http.StatusBadRequest, "placement is off and %s has no host in the policy: give one", vm)
		}
	}
	if host != "" {
		if old.p.Host(host) == nil {
			return Result{}, apiErr(http.StatusNotFound, "no host %q in the policy", host)
		}
		if _, _, err := mustParse(vm+".host="+host).Apply(old.p, old.place); err != nil {
			var re *placement.RefusedError
			if errors.As(err, &re) {
				return refuse(re.Reason, nil)
			}
			return Result{}, apiErr(http.StatusBadRequest, "%v", err)
		}
		why = "host given"
	} else {
		// Only this VM is a power-on request: the others that are off stay off.
		q := *old.p
		q.VMs = nil
		for _, w := range old.p.VMs {
			if old.place[w.Name] != "" || w.Name == vm {
				w.Host = ""
				q.VMs = append(q.VMs, w)
			}
		}
		r := placement.Plan(&q, old.place, placement.Demand{}, placement.Options{Threshold: 1})
		for _, d := range r.Decisions {
			if d.VM != vm {
				continue
			}
			switch d.Kind {
			case placement.Admit:
				host, why = d.To, d.Why
			case placement.Refuse:
				return refuse(d.Why, d.Details)
			}
		}
		if host == "" {
			return refuse("placement found no host", nil)
		}
	}
	st := &state{p: old.p, doc: old.doc, place: placement.Placement{}}
	for k, h := range old.place {
		st.place[k] = h
	}
	st.place[vm] = host
	evs := []Event{{Kind: "power-on", Subject: vm, Message: fmt.Sprintf("%s powered on on %s (%s)", vm, host, why), Reason: reason}}
	evs, err = c.commit(ctx, old, st, evs, nil)
	if err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
}

func mustParse(spec string) placement.Change {
	ch, err := placement.ParseChange(spec)
	if err != nil {
		panic(err)
	}
	return ch
}

// Migrate moves a running VM to another host where its reservations fit:
// its placement changes at once and the agents carry the move out (the
// decision is moving, then done when the destination reports the VM).
func (c *Controller) Migrate(ctx context.Context, vm string, req MigrateRequest) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, err := c.loadPolicy(ctx)
	if err != nil {
		return Result{}, err
	}
	if old.p.VM(vm) == nil {
		return Result{}, apiErr(http.StatusNotFound, "no VM %q in the policy", vm)
	}
	if old.p.Host(req.To) == nil {
		return Result{}, apiErr(http.StatusNotFound, "no host %q in the policy", req.To)
	}
	from := old.place[vm]
	switch from {
	case "":
		return Result{}, apiErr(http.StatusConflict, "%s is not running (power it on)", vm)
	case req.To:
		return Result{}, apiErr(http.StatusConflict, "%s already runs on %s", vm, req.To)
	}
	reason := reasonOr(req.Reason, "requested through the API")
	if _, _, err := mustParse(vm+".host="+req.To).Apply(old.p, old.place); err != nil {
		var re *placement.RefusedError
		if !errors.As(err, &re) {
			return Result{}, apiErr(http.StatusBadRequest, "%v", err)
		}
		ev := Event{Kind: "refuse", Subject: vm, Message: fmt.Sprintf("migrate to %s refused: %s", req.To, re.Reason), Reason: reason}
		_, _ = c.commit(ctx, old, &state{doc: old.doc, p: old.p, place: old.place}, []Event{ev}, nil)
		return Result{}, apiErr(http.StatusConflict, "migrate %s refused: %s", vm, re.Reason)
	}
	st := &state{p: old.p, doc: old.doc, place: clonePlace(old.place)}
	st.place[vm] = req.To
	c.noteMove(old, st, vm, from, req.To)
	decs := []Decision{{VM: vm, From: from, To: req.To, Status: "moving", Reason: reason}}
	evs := []Event{{Kind: "migrate", Subject: vm, Message: fmt.Sprintf("moving %s from %s to %s", vm, from, req.To), Reason: reason}}
	evs, err = c.commit(ctx, old, st, evs, decs)
	if err != nil {
		return Result{}, err
	}
	return Result{Revision: st.doc.Revision, Events: evs}, nil
}

// Explain says why a port (VM/NIC, HOST/CLASS) or a disk (VM/DISK) gets
// what it gets, level by level, with the VMs where they run and every
// demand unbounded.
func (c *Controller) Explain(ctx context.Context, port string) (Explanation, error) {
	st, err := c.loadPolicy(ctx)
	if err != nil {
		return Explanation{}, err
	}
	n := entitle.NewNet(entitle.Derive(st.p, entitle.Live{Hosts: st.place}))
	n.Compute()
	lines, err := n.Explain(port)
	if err != nil {
		for _, ds := range st.p.Datastores {
			s, serr := entitle.Storage(st.p, ds.Name, 0, nil)
			if serr != nil || s.Disk(port) == nil {
				continue
			}
			if lines, err = s.Explain(port); err == nil {
				break
			}
		}
	}
	if err != nil {
		return Explanation{}, apiErr(http.StatusNotFound, "%s: no such port or disk (VM/NIC of a running VM, HOST/CLASS, VM/DISK)", port)
	}
	return Explanation{Port: port, Lines: lines}, nil
}

// VMs lists the VMs of the policy, where they run and what their vNICs get.
func (c *Controller) VMs(ctx context.Context) ([]VMInfo, error) {
	st, err := c.load(ctx)
	if err != nil || st.p == nil {
		return []VMInfo{}, err
	}
	n := entitle.NewNet(entitle.Derive(st.p, entitle.Live{Hosts: st.place}))
	n.Compute()
	out := []VMInfo{}
	for _, v := range st.p.VMs {
		vi := VMInfo{Name: v.Name, Host: st.place[v.Name], State: "off", VCPUs: v.CPU.VCPUs, CPUReservation: v.CPU.ReservationMHz,
			MemoryBytes: int64(v.Memory), NICs: []NICInfo{}}
		if vi.Host != "" {
			vi.State = "running"
		}
		for _, nic := range v.NICs {
			ni := NICInfo{Port: policy.PortName(v.Name, nic.Name), ReservationBps: float64(nic.Reservation), Shares: float64(nic.Shares),
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
