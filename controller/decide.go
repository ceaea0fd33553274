package controller

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"sluice/admit"
	"sluice/placement"
	"sluice/policy"
)

// The controller's decisions: each is a pure function of a view and a
// request that returns what changes (a next) or refuses with an *Error,
// in which case nothing is written. The Controller's methods are the
// shell: they read the state and the agents' reports, decide, and commit
// the next in one transaction. Decisions are tested without etcd
// (decide_test.go, testdata/decide/).

// next is what a decision changes: the stored document, the policy in
// force, the desired placement, the VMs starting or moving, the migration
// history (nil: unchanged), and the events and decisions to record.
type next struct {
	doc       PolicyState
	p         *policy.Policy
	place     placement.Placement
	starting  map[string]Start
	history   map[string]placement.LastMove
	events    []Event
	decisions []Decision // new ones (numbered at commit)
	rewrites  []Decision // recorded ones with a new status
	settled   []string   // VMs no longer starting or moving (for summary)
	// scope names the hosts whose part of the policy can differ between
	// v.p and p (a set's targets); nil with a new p: every host.
	scope map[string]bool
}

// from is a next that changes nothing yet.
func (v view) from() *next {
	return &next{doc: v.doc, p: v.p, place: v.place, starting: v.starting}
}

// own makes n's placement and starting its own copies before a change.
func (n *next) own(v view) {
	if maps.Equal(n.place, v.place) {
		n.place = clonePlace(v.place)
	}
	if n.starting == nil || maps.Equal(n.starting, v.starting) {
		s := map[string]Start{}
		maps.Copy(s, v.starting)
		n.starting = s
	}
}

// moved records in n that vm moves from from to to now: its placement,
// its history (placement's cooldown and no-return window) and the move
// under way (the destination's agent migrates it in).
func (n *next) moved(v view, vm, from, to string) {
	n.own(v)
	n.place[vm] = to
	if n.history == nil {
		n.history = map[string]placement.LastMove{}
		maps.Copy(n.history, v.history)
	}
	n.history[vm] = placement.LastMove{AtNs: v.nowNs, From: from, To: to}
	n.starting[vm] = Start{Host: to, AtNs: v.nowNs, Move: true, From: from}
}

func refused(format string, args ...any) *Error {
	return apiErr(http.StatusConflict, format, args...)
}

// applyDoc makes p (the parsed document) the policy in force. VMs with a
// host in the document are placed there; the others stay where they are
// placed, if their host remains. Every placed VM that its host's agent
// does not report running yet is starting: it holds its reservations for
// StartGrace.
func (v view) applyDoc(file, document, reason string, p *policy.Policy) *next {
	p = withMeasured(p, v.reports)
	n := &next{p: p, place: placement.Placement{}, starting: map[string]Start{},
		doc: PolicyState{Revision: v.doc.Revision + 1, File: file, Document: document, AppliedAt: time.Unix(0, v.nowNs).UTC()}}
	for _, vm := range p.VMs {
		switch {
		case vm.Host != "":
			n.place[vm.Name] = vm.Host
		case v.place[vm.Name] != "" && p.Host(v.place[vm.Name]) != nil:
			n.place[vm.Name] = v.place[vm.Name]
		default:
			continue
		}
		// A VM its host's agent does not report yet is starting; on a
		// host without an agent it holds anyway (unknown).
		if h := n.place[vm.Name]; v.runsOn(vm.Name) != h && v.agents[h] {
			n.starting[vm.Name] = Start{Host: h, AtNs: v.nowNs}
		}
	}
	w := v
	w.p, w.place, w.starting = p, n.place, n.starting
	n.events = append([]Event{{Kind: "apply", Subject: file,
		Message: fmt.Sprintf("policy revision %d: %d hosts, %d VMs, %d placed, %d running", n.doc.Revision, len(p.Hosts), len(p.VMs), len(n.place), len(v.observed())),
		Reason:  reasonOr(reason, "policy applied")}}, faultEvents(nil, nil, p, w.holding())...)
	return n
}

// set makes changes in placement's grammar (TARGET.FIELD=VALUE), all or
// none. A change that breaks a rule no migration can mend is refused; one
// that breaks a host's reservations (of the VMs that hold them: running,
// starting, moving) is made, and recorded with the fault and placement's
// repair (recommended, or carried out in DRSAutomatic mode).
func (v view) set(chs []placement.Change, reason string, mode DRSMode) (*next, error) {
	hold := v.holding()
	p := v.p
	var changed []string
	touched := []string{} // the hosts whose faults the changes can alter
	for _, ch := range chs {
		touched = append(touched, ch.Hosts(p, hold)...)
		np, err := ch.Policy(p, hold)
		var re *placement.RefusedError
		if errors.As(err, &re) {
			return nil, refused("%s", re.Error())
		}
		if err != nil {
			return nil, apiErr(http.StatusBadRequest, "%v", err)
		}
		p = np
		if vm := ch.VM(p); vm != "" {
			changed = append(changed, vm)
		}
	}
	n := v.from()
	n.p = p
	// A change edits its host, or its VM (on the host where the VM is
	// placed, and the host a move names): only their parts change.
	n.scope = map[string]bool{}
	for _, ch := range chs {
		for _, h := range ch.Hosts(v.p, v.place) {
			n.scope[h] = true
		}
	}
	n.doc.Revision++
	n.doc.Changes = append(slices.Clone(v.doc.Changes), specs(chs)...)
	n.doc.AppliedAt = time.Unix(0, v.nowNs).UTC()
	for _, ch := range chs {
		n.events = append(n.events, Event{Kind: "set", Subject: subjectOf(ch), Message: ch.Spec + outcome(p, hold, ch),
			Reason: reasonOr(reason, "requested through the API")})
	}
	// Faults of the VMs that hold reservations: an off VM breaks nothing.
	faults := faultEventsOn(touched, v.p, hold, p, hold)
	n.events = append(n.events, faults...)
	if len(faults) > 0 {
		w := v
		w.p = p
		r := placement.Plan(p, hold, placement.Demand{}, placement.Options{Threshold: 1, Changed: changed})
		w.plannedMoves(n, r.Moves(), mode)
	}
	return n, nil
}

func specs(chs []placement.Change) []string {
	var out []string
	for _, ch := range chs {
		out = append(out, ch.Spec)
	}
	return out
}

// plannedMoves turns placement's moves (planned on the holding view) into
// decisions and events of n. In DRSAutomatic mode each move of a VM that
// runs is carried out (its placement changes, the destination's agent
// migrates it in); in manual mode it is recommended.
func (v view) plannedMoves(n *next, moves []placement.Decision, mode DRSMode) {
	for _, d := range moves {
		if v.observedOr(d.VM) != d.From {
			continue
		}
		if mode == DRSAutomatic {
			n.moved(v, d.VM, d.From, d.To)
			n.decisions = append(n.decisions, Decision{VM: d.VM, From: d.From, To: d.To, Status: "moving", Reason: d.Why})
			n.events = append(n.events, Event{Kind: "migrate", Subject: d.VM, Message: fmt.Sprintf("moving %s from %s to %s (DRS automatic)", d.VM, d.From, d.To), Reason: d.Why})
			continue
		}
		n.decisions = append(n.decisions, Decision{VM: d.VM, From: d.From, To: d.To, Status: "recommended", Reason: d.Why})
		n.events = append(n.events, Event{Kind: "recommend", Subject: d.VM, Message: fmt.Sprintf("move %s from %s to %s (DRS manual: sluice ctl approve the decision)", d.VM, d.From, d.To), Reason: d.Why})
	}
}

// observedOr is where vm holds its reservations (holding): where it runs,
// else where it is placed when nobody can tell.
func (v view) observedOr(vm string) string {
	if o := v.runsOn(vm); o != "" {
		return o
	}
	if h := v.place[vm]; h != "" && !v.agents[h] {
		return h
	}
	return ""
}

// powerOn places a VM that is off on host (given), else (choose) where
// placement puts it among the VMs that hold reservations, else on its
// policy host. A VM whose reservations fit nowhere (or not on the host
// given) is refused with the reason. The VM is then starting there: it
// holds its reservations until its host's agent reports it, for
// StartGrace at most.
func (v view) powerOn(vm, host, reason string, choose bool) (*next, error) {
	pv := v.p.VM(vm)
	if pv == nil {
		return nil, apiErr(http.StatusNotFound, "no VM %q in the policy", vm)
	}
	switch st, _ := v.state(vm); st {
	case "running":
		return nil, refused("%s is already running on %s", vm, v.runsOn(vm))
	case "starting", "moving":
		return nil, refused("%s is already %s on %s", vm, st, v.place[vm])
	case "unknown":
		return nil, refused("%s is placed on %s, which has no agent to tell whether it runs: it may already run there", vm, v.place[vm])
	}
	reason = reasonOr(reason, "requested through the API")
	hold := v.holding()
	why := ""
	if host == "" && !choose {
		if host = pv.Host; host == "" {
			return nil, apiErr(http.StatusBadRequest, "placement is off and %s has no host in the policy: give one", vm)
		}
	}
	if host != "" {
		if v.p.Host(host) == nil {
			return nil, apiErr(http.StatusNotFound, "no host %q in the policy", host)
		}
		if _, _, err := mustParse(vm+".host="+host).Apply(v.p, hold); err != nil {
			var re *placement.RefusedError
			if errors.As(err, &re) {
				return nil, refused("power-on %s refused: %s", vm, re.Reason)
			}
			return nil, apiErr(http.StatusBadRequest, "%v", err)
		}
		why = "host given"
	} else {
		// Only this VM is a power-on request: the others that hold no
		// reservation stay out.
		q := *v.p
		q.VMs = nil
		for _, w := range v.p.VMs {
			if hold[w.Name] != "" || w.Name == vm {
				w.Host = ""
				q.VMs = append(q.VMs, w)
			}
		}
		r := placement.Plan(&q, hold, placement.Demand{}, placement.Options{Threshold: 1})
		for _, d := range r.Decisions {
			if d.VM != vm {
				continue
			}
			switch d.Kind {
			case placement.Admit:
				host, why = d.To, d.Why
			case placement.Refuse:
				e := refused("power-on %s refused: %s", vm, d.Why)
				e.Body.Details = d.Details
				return nil, e
			}
		}
		if host == "" {
			return nil, refused("power-on %s refused: placement found no host", vm)
		}
	}
	n := v.from()
	n.own(v)
	n.place[vm] = host
	n.starting[vm] = Start{Host: host, AtNs: v.nowNs}
	n.events = []Event{{Kind: "power-on", Subject: vm, Message: fmt.Sprintf("%s powered on on %s (%s): it holds its reservations there while it starts", vm, host, why), Reason: reason}}
	return n, nil
}

// admit answers a host whose hypervisor is about to start a domain (the
// libvirt hook, through the host's agent). A VM starting or moving to the
// host, or already running there, is admitted as it is; a VM that runs on
// another host is coming by a migration sluice did not decide: admitted
// when it fits here (the agents then report where it runs); a VM that is
// off is powered on here (powerOn: it holds its reservations while it
// starts) or refused with the reason. A name the policy does not have is
// 404: the host decides with the policy's unnamedVMs setting.
func (v view) admit(name string, req AdmitRequest) (*next, AdmitAnswer, error) {
	vm := admit.VMName(v.p, admit.Domain{Name: name, UUID: req.UUID})
	if vm == "" {
		return nil, AdmitAnswer{}, apiErr(http.StatusNotFound, "no VM %q in the policy", name)
	}
	if v.p.Host(req.Host) == nil {
		return nil, AdmitAnswer{}, apiErr(http.StatusNotFound, "no host %q in the policy", req.Host)
	}
	ans := AdmitAnswer{VM: vm, Revision: v.doc.Revision}
	st, _ := v.state(vm)
	on := v.runsOn(vm)
	switch {
	case (st == "starting" || st == "moving") && v.place[vm] == req.Host:
		ans.Allow, ans.Why = true, fmt.Sprintf("%s is %s on %s: it holds its reservations there", vm, st, req.Host)
		return nil, ans, nil
	case on == req.Host:
		ans.Allow, ans.Why = true, fmt.Sprintf("%s already runs on %s", vm, req.Host)
		return nil, ans, nil
	case on != "":
		if _, _, err := mustParse(vm+".host="+req.Host).Apply(v.p, v.holding()); err != nil {
			var re *placement.RefusedError
			if !errors.As(err, &re) {
				return nil, AdmitAnswer{}, apiErr(http.StatusBadRequest, "%v", err)
			}
			ans.Why = fmt.Sprintf("%s runs on %s and does not fit on %s: %s", vm, on, req.Host, re.Reason)
			return nil, ans, nil
		}
		ans.Allow, ans.Why = true, fmt.Sprintf("%s runs on %s and fits on %s (a migration)", vm, on, req.Host)
		return nil, ans, nil
	}
	n, err := v.powerOn(vm, req.Host, reasonOr(req.Reason, "the libvirt hook of "+req.Host+": the domain is starting"), false)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusConflict {
			return nil, AdmitAnswer{}, err
		}
		ans.Why, ans.Details = e.Body.Error, e.Body.Details
		return nil, ans, nil
	}
	ans.Allow, ans.Why = true, n.events[0].Message
	return n, ans, nil
}

// migrate moves a running VM to another host where its reservations fit:
// its placement changes at once and the destination's agent migrates it
// in (the decision is moving, then done when the destination reports the
// VM, or failed with the agent's reason).
func (v view) migrate(vm, to, reason string) (*next, error) {
	if v.p.VM(vm) == nil {
		return nil, apiErr(http.StatusNotFound, "no VM %q in the policy", vm)
	}
	if v.p.Host(to) == nil {
		return nil, apiErr(http.StatusNotFound, "no host %q in the policy", to)
	}
	from := v.observedOr(vm)
	switch {
	case from == "":
		return nil, refused("%s is not running (power it on)", vm)
	case from == to:
		return nil, refused("%s already runs on %s", vm, to)
	}
	reason = reasonOr(reason, "requested through the API")
	if _, _, err := mustParse(vm+".host="+to).Apply(v.p, v.holding()); err != nil {
		var re *placement.RefusedError
		if !errors.As(err, &re) {
			return nil, apiErr(http.StatusBadRequest, "%v", err)
		}
		return nil, refused("migrate %s refused: %s", vm, re.Reason)
	}
	n := v.from()
	n.moved(v, vm, from, to)
	n.decisions = []Decision{{VM: vm, From: from, To: to, Status: "moving", Reason: reason}}
	n.events = []Event{{Kind: "migrate", Subject: vm, Message: fmt.Sprintf("moving %s from %s to %s", vm, from, to), Reason: reason}}
	return n, nil
}

// approve carries out a recommended (or pending) decision d: its VM must
// still run on d.From and fit on d.To. A stale decision is superseded
// (written) and refused.
func (v view) approve(d Decision, reason string) (*next, error) {
	if d.Status != "recommended" && d.Status != "pending" {
		return nil, refused("decision %d is %s: only a recommended or pending one can be approved", d.Seq, d.Status)
	}
	reason = reasonOr(reason, fmt.Sprintf("decision %d approved", d.Seq))
	if h := v.observedOr(d.VM); h != d.From {
		n := v.from()
		d.Status = "superseded"
		n.rewrites = []Decision{d}
		n.events = []Event{{Kind: "superseded", Subject: d.VM, Message: fmt.Sprintf("decision %d superseded: %s runs on %q, not %s", d.Seq, d.VM, h, d.From), Reason: reason}}
		return n, refused("decision %d is stale: %s runs on %q, not %s", d.Seq, d.VM, h, d.From)
	}
	if _, _, err := mustParse(d.VM+".host="+d.To).Apply(v.p, v.holding()); err != nil {
		return nil, refused("decision %d: %s no longer fits on %s: %v", d.Seq, d.VM, d.To, err)
	}
	n := v.from()
	n.moved(v, d.VM, d.From, d.To)
	d.Status = "moving"
	n.rewrites = []Decision{d}
	n.events = []Event{{Kind: "migrate", Subject: d.VM, Message: fmt.Sprintf("moving %s from %s to %s (decision %d approved)", d.VM, d.From, d.To, d.Seq), Reason: reason}}
	return n, nil
}

// report takes host's new report r (old: its previous one, nil at
// registration) with the recorded decisions: a moving decision whose VM
// the destination reports is done; one whose move the destination could
// not make (r.Failed) is failed, and the VM is placed back where it runs;
// starting entries observed or past their grace are settled; a VM seen
// running where it is not placed, or a domain the policy does not name,
// is an event. It returns nil when nothing is to be written.
func (v view) report(host string, old, r *Report, decisions []Decision) *next {
	n := v.from()
	write := false
	for _, d := range decisions {
		if d.Status != "moving" || d.To != host {
			continue
		}
		switch {
		case slices.Contains(r.VMs, d.VM):
			took := time.Duration(v.nowNs - d.Time.UnixNano()).Round(time.Millisecond)
			d.Status = "done"
			n.rewrites = append(n.rewrites, d)
			n.events = append(n.events, Event{Kind: "migrated", Subject: d.VM, Message: fmt.Sprintf("%s runs on %s (decision %d, %v after it)", d.VM, host, d.Seq, took),
				Reason: "reported by the agent of " + host})
			write = true
		case r.Failed[d.VM] != "":
			d.Status = "failed"
			n.rewrites = append(n.rewrites, d)
			n.own(v)
			if o := v.runsOn(d.VM); o != "" {
				n.place[d.VM] = o
			} else {
				n.place[d.VM] = d.From
			}
			delete(n.starting, d.VM)
			n.events = append(n.events, Event{Kind: "migrate-failed", Subject: d.VM,
				Message: fmt.Sprintf("moving %s from %s to %s failed (decision %d): %s; it stays placed on %s", d.VM, d.From, host, d.Seq, r.Failed[d.VM], n.place[d.VM]),
				Reason:  "reported by the agent of " + host})
			write = true
		}
	}
	if old == nil || !slices.Equal(old.VMs, r.VMs) || !slices.Equal(old.Unnamed, r.Unnamed) {
		var was []string
		if old != nil {
			was = old.VMs
		}
		adopted := false
		for _, vm := range r.VMs {
			if slices.Contains(was, vm) || !v.known[vm] {
				continue
			}
			// A VM that runs where it is not placed (started outside
			// sluice, or moved behind its back) is placed where it runs:
			// the hypervisor is the truth. If its reservations do not fit
			// there, that is a fault placement repairs.
			if h := v.place[vm]; h != host && !(v.starting[vm].Move && v.starting[vm].Host == host) {
				n.own(v)
				n.place[vm] = host
				delete(n.starting, vm)
				adopted = true
				n.events = append(n.events, Event{Kind: "observed", Subject: vm,
					Message: fmt.Sprintf("%s runs on %s (placed on %q): placed on %s, its reservations held there", vm, host, h, host),
					Reason:  "reported by the agent of " + host})
				write = true
			}
		}
		if adopted {
			// What held before this report: the VMs it newly reports as
			// they were held without it.
			without := maps.Clone(v.observed())
			for _, vm := range r.VMs {
				if !slices.Contains(was, vm) && without[vm] == host {
					delete(without, vm)
				}
			}
			w0 := v.withObserved(without)
			w := v
			w.place, w.starting = n.place, n.starting
			n.events = append(n.events, faultEvents(v.p, w0.holding(), v.p, w.holding())...)
		}
		for _, d := range r.Unnamed {
			if old == nil || !slices.Contains(old.Unnamed, d) {
				n.events = append(n.events, Event{Kind: "observed", Subject: d,
					Message: fmt.Sprintf("domain %s runs on %s and is not in the policy: classed as its unnamedVMs setting says", d, host),
					Reason:  "reported by the agent of " + host})
				write = true
			}
		}
	}
	var was map[string]float64
	if old != nil {
		was = old.CapacityIOPS
	}
	if !maps.Equal(was, r.CapacityIOPS) {
		// A datastore measured slower than its disks' reservations (a
		// rebuild, a failed path): a fault, reported; nothing is taken
		// from the VMs.
		before := maps.Clone(v.reports)
		if old != nil {
			before[host] = old
		} else {
			delete(before, host)
		}
		if op := withMeasured(v.p, before); op != v.p {
			if evs := faultEvents(op, v.holding(), v.p, v.holding()); len(evs) > 0 {
				n.events = append(n.events, evs...)
				write = true
			}
		}
	}
	if v.settle(n) {
		write = true
	}
	if !write {
		return nil
	}
	return n
}

// settle removes from n the starting entries that no longer hold
// (view.settled) and records the expired ones; it tells whether any was.
func (v view) settle(n *next) bool {
	w := v
	w.starting = n.starting
	done, expired := w.settled()
	if len(done) == 0 {
		return false
	}
	n.own(v)
	for _, vm := range done {
		delete(n.starting, vm)
	}
	n.settled = append(n.settled, done...)
	n.events = append(n.events, expired...)
	return true
}

// drs is one pass of placement over the cluster as it runs (the VMs that
// hold reservations, with the measured rates as network demand): faults
// are repaired and, with threshold ≥ 2, the cluster rebalanced; a move
// already recommended or under way is not planned again. Starting
// entries are settled. It returns nil when nothing is to be written.
func (v view) drs(demand placement.Demand, decisions []Decision, threshold int, mode DRSMode) *next {
	n := v.from()
	settled := v.settle(n)
	w := v
	w.starting = n.starting
	r := placement.Plan(v.p, w.holding(), demand, placement.Options{Threshold: threshold, NowNs: v.nowNs, History: v.history})
	var moves []placement.Decision
	for _, m := range r.Moves() {
		dup := slices.ContainsFunc(decisions, func(d Decision) bool {
			return (d.Status == "recommended" && mode == DRSManual || d.Status == "moving") && d.VM == m.VM && d.To == m.To
		})
		if !dup {
			moves = append(moves, m)
		}
	}
	w.plannedMoves(n, moves, mode)
	if !settled && len(n.decisions) == 0 {
		return nil
	}
	return n
}

// vmInfo is what VMs lists for one VM.
func (v view) vmInfo(vm *policy.VM) VMInfo {
	state, since := v.state(vm.Name)
	return VMInfo{Name: vm.Name, Host: v.place[vm.Name], Observed: v.runsOn(vm.Name), State: state, Since: since,
		VCPUs: vm.CPU.VCPUs, CPUReservation: vm.CPU.ReservationMHz, MemoryBytes: int64(vm.Memory), NICs: []NICInfo{}}
}

// summary is a one-line account of n, for logs and tests.
func (n *next) summary() string {
	var b strings.Builder
	for _, e := range n.events {
		fmt.Fprintf(&b, "event %s %s: %s\n", e.Kind, e.Subject, e.Message)
	}
	for _, d := range n.decisions {
		fmt.Fprintf(&b, "decision %s %s %s→%s\n", d.Status, d.VM, d.From, d.To)
	}
	for _, d := range n.rewrites {
		fmt.Fprintf(&b, "decision %d now %s\n", d.Seq, d.Status)
	}
	if len(n.settled) > 0 {
		fmt.Fprintf(&b, "settled %s\n", strings.Join(n.settled, " "))
	}
	return b.String()
}
