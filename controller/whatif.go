package controller

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"time"

	"sluice/entitle"
	"sluice/placement"
	"sluice/policy"
)

// WhatIfResult is what a set of changes would give on the cluster as it
// is, decided by the very decision Set commits (view.set) and not
// committed: whether it is admitted (else the refusal), the events it
// would record, the migrations it would cause (placement's repair,
// carried out in DRS automatic mode, recommended in manual mode), and
// every port's entitlement after it with those migrations carried out.
type WhatIfResult struct {
	Revision int64    `json:"revision"` // the policy revision it was decided on
	Admitted bool     `json:"admitted"`
	Refusal  string   `json:"refusal,omitempty"` // why not, when not admitted
	Details  []string `json:"details,omitempty"` // per-host shortfalls of a refusal
	DRS      DRSMode  `json:"drs"`               // what becomes of the moves: automatic (carried out) or manual (recommended)
	// Events are the events Set would record (not numbered: nothing is
	// recorded).
	Events []Event      `json:"events"`
	Moves  []WhatIfMove `json:"moves"`
	Hosts  []WhatIfHost `json:"hosts"` // where each VM that holds reservations would run
	Rates  []WhatIfRate `json:"rates"`
	// Faults are the reservations that would still not fit after the
	// moves, one line each.
	Faults []string `json:"faults,omitempty"`
}

// WhatIfMove is a migration the change would cause.
type WhatIfMove struct {
	VM     string `json:"vm"`
	From   string `json:"from"`
	To     string `json:"to"`
	Status string `json:"status"` // moving (DRS automatic) or recommended (manual)
	Reason string `json:"reason"`
}

// WhatIfHost is a host and the VMs that would hold reservations there.
type WhatIfHost struct {
	Host string   `json:"host"`
	VMs  []string `json:"vms"`
}

// WhatIfRate is one port's entitlement before and after the change, with
// every demand unbounded (what `sluice alloc` gives) among the VMs that
// hold reservations; a port of a VM that holds none is absent.
type WhatIfRate struct {
	Port           string   `json:"port"`
	Uplink         string   `json:"uplink"` // HOST/UPLINK after the change
	ReservationBps float64  `json:"reservation_bps"`
	Shares         float64  `json:"shares"`
	LimitBps       *float64 `json:"limit_bps"`
	AllocBps       float64  `json:"alloc_bps"`
	// BeforeUplink and BeforeBps are the port's uplink and entitlement
	// now ("" and 0 when it has none now).
	BeforeUplink string  `json:"before_uplink,omitempty"`
	BeforeBps    float64 `json:"before_bps"`
}

// WhatIf answers what Set would do with req, and writes nothing: the
// decision runs on the state and the agents' reports as Set's does (run),
// and its result is shown instead of committed. A change that Set would
// refuse (409) is an answer with Admitted false and the refusal; a
// malformed one is an error (400), as for Set.
func (c *Controller) WhatIf(ctx context.Context, req SetRequest) (WhatIfResult, error) {
	d, err := c.setDecision(req)
	if err != nil {
		return WhatIfResult{}, err
	}
	st, err := c.loadPolicy(ctx)
	if err != nil {
		return WhatIfResult{}, err
	}
	reports, err := c.reports(ctx)
	if err != nil {
		return WhatIfResult{}, err
	}
	n, after, derr := c.run(st, st, reports, true, d)
	return c.whatIfOf(st, reports, n, after, derr)
}

// whatIfOf renders what decision n (nil: refused with derr) made on st
// with reports would do, after being the state it leads to. It does no
// I/O: decide_test.go runs it on states in memory.
func (c *Controller) whatIfOf(st *state, reports map[string]*Report, n *next, after *state, derr error) (WhatIfResult, error) {
	res := WhatIfResult{Revision: st.doc.Revision, DRS: c.cfg.DRS, Events: []Event{}, Moves: []WhatIfMove{}, Hosts: []WhatIfHost{}, Rates: []WhatIfRate{}}
	now := c.viewOf(st, reports)
	if n == nil {
		var e *Error
		if errors.As(derr, &e) && e.Status == http.StatusConflict {
			res.Refusal, res.Details = e.Body.Error, e.Body.Details
			return res, nil
		}
		return WhatIfResult{}, derr
	}
	res.Admitted = true
	at := time.Unix(0, now.nowNs).UTC()
	for _, e := range n.events {
		e.Time = at
		res.Events = append(res.Events, e)
	}
	// Where the VMs would hold their reservations: as the state after the
	// change says, with every move carried out (a recommended one once
	// approved).
	hold := c.viewOf(after, reports).holding()
	for _, m := range n.decisions {
		res.Moves = append(res.Moves, WhatIfMove{VM: m.VM, From: m.From, To: m.To, Status: m.Status, Reason: m.Reason})
		hold[m.VM] = m.To
	}
	byHost := map[string][]string{}
	for vm, h := range hold {
		byHost[h] = append(byHost[h], vm)
	}
	for _, h := range sortedKeys(byHost) {
		sort.Strings(byHost[h])
		res.Hosts = append(res.Hosts, WhatIfHost{Host: h, VMs: byHost[h]})
	}
	for _, f := range placement.Check(after.p, hold, placement.Options{}) {
		res.Faults = append(res.Faults, f.Why)
	}
	res.Rates = whatIfRates(st.p, now.holding(), after.p, hold)
	return res, nil
}

// whatIfRates is every vNIC's entitlement in (p, hold) beside its
// entitlement in (p0, hold0), with every demand unbounded.
func whatIfRates(p0 *policy.Policy, hold0 placement.Placement, p *policy.Policy, hold placement.Placement) []WhatIfRate {
	before := entitle.NewNet(entitle.Derive(p0, entitle.Live{Hosts: hold0}))
	before.Compute()
	n := entitle.NewNet(entitle.Derive(p, entitle.Live{Hosts: hold}))
	n.Compute()
	out := []WhatIfRate{}
	for i := range p.VMs {
		vm := &p.VMs[i]
		for _, nic := range vm.NICs {
			port := policy.PortName(vm.Name, nic.Name)
			pts := n.Port(port)
			if len(pts) == 0 {
				continue
			}
			r := WhatIfRate{Port: port, Uplink: pts[0].Host + "/" + pts[0].Uplink, ReservationBps: float64(nic.Reservation), Shares: float64(nic.Shares),
				LimitBps: limitPtr(entitle.RateLimit(nic.Limit)), AllocBps: pts[0].AllocBps()}
			if b := before.Port(port); len(b) > 0 {
				r.BeforeUplink, r.BeforeBps = b[0].Host+"/"+b[0].Uplink, b[0].AllocBps()
			}
			out = append(out, r)
		}
	}
	return out
}
