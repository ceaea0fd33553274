// Package hostside carries the controller's desired state out on one host:
// it is the agent's side of controller.Follower. It moves in the VMs the
// desired state moves here (the executor of a migration: the lab re-plugs
// a VM's vNICs or migrates its guest, a libvirt host migrates the domain
// live from the peer that runs it), hands the host's part of the policy
// to the agent's loop and the hook's admitter, and reports what runs on
// the host, since when, the moves that failed and the measured rates.
//
// It decides nothing: placement and admission are the controller's, the
// kernel is the agent's. A move that fails is reported, never fatal: the
// agent keeps enforcing. A VM placed here that runs nowhere is off:
// nothing moves it, and it gets its class when it starts here.
package hostside

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"sluice/agent"
	"sluice/controller"
	"sluice/policy"
)

// Config says how a Side reaches its host.
type Config struct {
	// Lab is a lab host's inventory, whose running VMs the Side sets as
	// VMs move in. Nil on a libvirt host: its inventory sees the VMs
	// itself (VMs).
	Lab *LabInventory
	// VMs returns the VMs the host's inventory runs (with Lab nil).
	VMs func() []string
	// Mover moves vm in to this host from wherever it runs; nil: the host
	// cannot move VMs in (each move is reported failed).
	Mover func(vm string) error
	// Policies receives the host's part of each desired state: the
	// agent's Run loop (agent.Config.Policies).
	Policies chan<- *policy.Policy
	// Unnamed returns the domains running here that the policy does not
	// name, UUIDs the UUID of each running domain by name; nil: none.
	Unnamed func() []string
	UUIDs   func() map[string]string
	// Log receives the failed moves of each desired state (joined); nil:
	// not logged.
	Log func(err error)
}

// Side is one host's side of the controller (controller.AgentSide).
type Side struct {
	cfg      Config
	ctx      context.Context
	admitter *agent.Admitter // the hook's answers: the policy and the VMs starting here
	changed  chan struct{}   // the running VMs or the failed moves changed: report now

	mu         sync.Mutex
	capacities func() map[string]float64 // SetCapacities
	stats      agent.Stats
	failed     map[string]string    // VM → why its last move in failed, while the move is asked
	since      map[string]time.Time // VM → when it was first seen running here
	lastVMs    []string             // the running VMs of the last report or step
}

// New returns the side of a host as cfg describes it.
func New(cfg Config) *Side {
	return &Side{cfg: cfg, ctx: context.Background(), changed: make(chan struct{}, 1)}
}

// Attach binds the side to the agent's life (Apply returns once ctx is
// done) and to the hook's admitter (nil: none), which gets each desired
// state's policy and starting VMs. Call it before the follower runs.
func (s *Side) Attach(ctx context.Context, adm *agent.Admitter) {
	s.ctx, s.admitter = ctx, adm
}

// Arrive carries out d's moves in and, on a lab host, sets the inventory's
// running VMs. It records failed moves for the reports and returns them
// joined (for the log); the agent goes on either way.
func (s *Side) Arrive(d controller.DesiredHost) error {
	var errs []error
	failed := map[string]string{}
	if s.cfg.Lab == nil {
		errs = s.migrateIn(d, failed)
	} else {
		have, _ := s.cfg.Lab.VMs()
		var run []string
		for _, vm := range d.VMs {
			if !slices.Contains(have, vm) {
				if err := s.move(vm, failed); err != nil {
					errs = append(errs, fmt.Errorf("moving %s in: %w", vm, err))
					continue
				}
			}
			run = append(run, vm)
		}
		s.cfg.Lab.setRunning(run)
	}
	s.mu.Lock()
	news := !maps.Equal(s.failed, failed)
	s.failed = failed
	s.mu.Unlock()
	if news {
		s.signal() // the controller learns of a failed move at once
	}
	s.noteVMs()
	return errors.Join(errs...)
}

// migrateIn moves in the VMs d moves here (d.Moves) that the host's
// libvirt inventory does not run yet; the inventory sees them arrive by
// libvirt's events. A VM placed here that runs nowhere is off: nothing
// moves it. Failed moves go into failed, VM → why.
func (s *Side) migrateIn(d controller.DesiredHost, failed map[string]string) []error {
	if s.cfg.VMs == nil {
		return nil
	}
	have := s.cfg.VMs()
	var errs []error
	for _, m := range d.Moves {
		if slices.Contains(have, m.VM) {
			continue
		}
		if err := s.move(m.VM, failed); err != nil {
			errs = append(errs, fmt.Errorf("moving %s in from %s: %w", m.VM, m.From, err))
		}
	}
	return errs
}

// move moves vm in with the Mover, noting in failed why it could not.
func (s *Side) move(vm string, failed map[string]string) error {
	err := errors.New("no executor for this inventory")
	if s.cfg.Mover != nil {
		err = s.cfg.Mover(vm)
	}
	if err != nil {
		failed[vm] = err.Error()
	}
	return err
}

// Apply takes a new desired state: moves carried out (or their failure
// recorded), then the host's part of the policy handed to the admitter
// and the agent. Only a stopped agent is an error: a move that cannot be
// made is reported, not retried here (the controller decides again).
func (s *Side) Apply(d controller.DesiredHost) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	if err := s.Arrive(d); err != nil && s.cfg.Log != nil {
		s.cfg.Log(err)
	}
	if s.admitter != nil {
		s.admitter.Set(d.Policy, d.Starting)
	}
	select {
	case s.cfg.Policies <- d.Policy:
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	return nil
}

// running returns the VMs that run here now, sorted.
func (s *Side) running() []string {
	var vms []string
	if s.cfg.Lab != nil {
		vms, _ = s.cfg.Lab.VMs()
	} else if s.cfg.VMs != nil {
		vms = s.cfg.VMs()
	}
	vms = slices.Clone(vms)
	sort.Strings(vms)
	return vms
}

// noteVMs notes the running VMs (when each was first seen) and, when they
// changed since the last note, signals Changed: the host reports at once
// (a VM started or destroyed behind sluice's back is reported within the
// agent's step).
func (s *Side) noteVMs() {
	vms := s.running()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since == nil {
		s.since = map[string]time.Time{}
	}
	for _, vm := range vms {
		if _, ok := s.since[vm]; !ok {
			s.since[vm] = time.Now().UTC()
		}
	}
	for vm := range s.since {
		if !slices.Contains(vms, vm) {
			delete(s.since, vm)
		}
	}
	if slices.Equal(vms, s.lastVMs) {
		return
	}
	s.lastVMs = vms
	s.signal()
}

// signal asks for a report now.
func (s *Side) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Changed is signalled when the host's running VMs or its failed moves
// changed: the follower reports at once.
func (s *Side) Changed() <-chan struct{} { return s.changed }

// SetStats keeps the agent's last statistics for the reports, and notes
// the running VMs (call it each step).
func (s *Side) SetStats(st agent.Stats) {
	s.mu.Lock()
	s.stats = st
	s.mu.Unlock()
	s.noteVMs()
}

// SetCapacities makes f the source of the datastores' capacities the
// host measured, in the reports (nil: none).
func (s *Side) SetCapacities(f func() map[string]float64) {
	s.mu.Lock()
	s.capacities = f
	s.mu.Unlock()
}

// Report is what the host reports now: its running VMs and since when,
// the domains the policy does not name, the failed moves, and each
// port's measured sending rate.
func (s *Side) Report() controller.Report {
	vms := s.running()
	s.mu.Lock()
	st, capf := s.stats, s.capacities
	r := controller.Report{VMs: vms, Uplinks: []string{}, RatesBps: map[string]float64{}, Time: time.Now().UTC(),
		Since: map[string]time.Time{}, Failed: maps.Clone(s.failed)}
	for _, vm := range vms {
		if t, ok := s.since[vm]; ok {
			r.Since[vm] = t
		}
	}
	s.mu.Unlock()
	if r.VMs == nil {
		r.VMs = []string{}
	}
	if r.Failed == nil {
		r.Failed = map[string]string{}
	}
	if s.cfg.Unnamed != nil {
		r.Unnamed = s.cfg.Unnamed()
	}
	if s.cfg.UUIDs != nil && len(r.Unnamed) > 0 {
		all := s.cfg.UUIDs()
		r.UUIDs = map[string]string{}
		for _, d := range r.Unnamed {
			if u := all[d]; u != "" {
				r.UUIDs[d] = u
			}
		}
	}
	if capf != nil {
		if m := capf(); len(m) > 0 {
			r.CapacityIOPS = m
		}
	}
	for _, u := range st.Uplinks {
		if u.Direction == "inbound" {
			continue // the controller's rates are what the ports send
		}
		r.Uplinks = append(r.Uplinks, u.Uplink)
		for _, pt := range u.Ports {
			r.RatesBps[pt.Port] = pt.RateBps
		}
	}
	return r
}
