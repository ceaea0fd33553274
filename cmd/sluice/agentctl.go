package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"sluice/admit"
	"sluice/agent"
	"sluice/controller"
	"sluice/internal/clock"
	"sluice/lab"
	"sluice/policy"
)

// controllerFlags connect an agent to the controller (sluice agent
// --controller URL --token-file F --ca F) instead of a policy file.
type controllerFlags struct {
	server, tokenFile, ca string
	mig                   migrateFlags // a libvirt host's executor of migrations
}

func (f *controllerFlags) register(fs *flag.FlagSet) {
	f.registerClient(fs, "the controller's URL (https://HOST:PORT): follow its policy and desired state instead of --policy")
	f.mig.register(fs)
}

// registerClient registers the flags that reach the controller (--controller
// with usage url, --token-file, --ca).
func (f *controllerFlags) registerClient(fs *flag.FlagSet, url string) {
	fs.StringVar(&f.server, "controller", "", url)
	fs.StringVar(&f.tokenFile, "token-file", "", "bearer token for the controller")
	fs.StringVar(&f.ca, "ca", "", "the controller's certificate (PEM)")
}

func (f *controllerFlags) client() (*controller.Client, error) {
	if f.tokenFile == "" {
		return nil, errors.New("--controller needs --token-file")
	}
	tok, err := controller.ReadToken(f.tokenFile)
	if err != nil {
		return nil, err
	}
	return controller.NewClient(f.server, tok, f.ca)
}

// startState waits for host's desired state, which holds the host's
// part of the policy: the controller publishes it once a policy naming
// the host is applied. Until then, and while the controller cannot be
// reached, the agent waits and says why in one line (a daemon does not
// exit because the cluster is not as planned); a refused token is an
// error.
func (f *controllerFlags) startState(ctx context.Context, cl *controller.Client, host string, logf func(format string, args ...any)) (controller.DesiredHost, error) {
	said := ""
	var wait time.Duration // the first read does not wait
	for {
		d, err := cl.WatchDesired(ctx, host, 0, wait)
		why := ""
		switch st := controller.StatusOf(err); {
		case err == nil && d.Policy != nil:
			return d, nil
		case ctx.Err() != nil:
			return controller.DesiredHost{}, ctx.Err()
		case st == http.StatusUnauthorized || st == http.StatusForbidden:
			return controller.DesiredHost{}, fmt.Errorf("controller %s: %w", f.server, err)
		case err == nil:
			why = fmt.Sprintf("the controller has published no desired state for host %s yet (no policy applied)", host)
		case st == http.StatusNotFound:
			why = fmt.Sprintf("controller %s: %v", f.server, err)
		default:
			why = fmt.Sprintf("controller %s unreachable: %v", f.server, err)
		}
		if why != said {
			logf("%s; waiting", why)
			said = why
		}
		wait = 30 * time.Second
		if err != nil && !clock.SleepCtx(ctx, time.Second) {
			return controller.DesiredHost{}, ctx.Err()
		}
	}
}

// askController is an Admitter's Ask: the controller decides whether a
// domain may start on host. A domain it does not know (404: the policy
// does not name it) is left to the agent.
func askController(cl *controller.Client, host string) func(ctx context.Context, dom admit.Domain) (admit.Decision, bool, error) {
	return func(ctx context.Context, dom admit.Domain) (admit.Decision, bool, error) {
		a, err := cl.Admit(ctx, dom.Name, controller.AdmitRequest{Host: host, UUID: dom.UUID})
		switch {
		case controller.StatusOf(err) == http.StatusNotFound:
			return admit.Decision{}, false, nil
		case err != nil:
			return admit.Decision{}, false, err
		}
		return admit.Decision{Allow: a.Allow, VM: a.VM, Why: a.Why, Details: a.Details}, true, nil
	}
}

// movableInventory is the lab's inventory of a host whose VMs come and go
// by migration: it knows the vNICs of every VM of the lab, and runs the
// VMs the controller puts on the host that are plugged here.
type movableInventory struct {
	base *agent.StaticInventory // devices, address, cgroups of the host
	mu   sync.Mutex
	run  []string
	all  map[string]agent.VNICMatch
}

func newMovableInventory(pl *lab.Plan, host string) (*movableInventory, error) {
	base, err := pl.Inventory(host)
	if err != nil {
		return nil, err
	}
	m := &movableInventory{base: base, all: map[string]agent.VNICMatch{}}
	for _, v := range pl.VMs {
		for _, n := range v.NICs {
			m.all[n.Port] = agent.VNICMatch{Index: n.GlobalIdx, HostDev: n.HostDev, SrcIP: n.IP}
		}
	}
	return m, nil
}

func (m *movableInventory) VMs() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.run), nil
}

func (m *movableInventory) setRunning(vms []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.run = slices.Clone(vms)
	sort.Strings(m.run)
}

func (m *movableInventory) UplinkDevice(u string) (string, error) { return m.base.UplinkDevice(u) }

func (m *movableInventory) VNIC(port string) (agent.VNICMatch, bool) {
	vm, _, _ := cutVMPort(port)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.run, vm) {
		return agent.VNICMatch{}, false
	}
	v, ok := m.all[port]
	return v, ok
}

func (m *movableInventory) HostAddr() netip.Addr { return m.base.HostAddr() }

func (m *movableInventory) VMCgroup(vm string) (string, bool) { return m.base.VMCgroup(vm) }

func cutVMPort(port string) (string, string, bool) {
	for i := range len(port) {
		if port[i] == '/' {
			return port[:i], port[i+1:], true
		}
	}
	return port, "", false
}

// agentSide carries the controller's desired state out on the host: the
// executor side of a migration. The VMs the desired state moves here
// (DesiredHost.Moves) are moved in by mover (the lab re-plugs their
// vNICs or migrates its guests; a libvirt host migrates them live from
// the peer that runs them, agentmigrate.go); a move that fails is
// reported (Report.Failed), never fatal: the agent keeps enforcing. A VM
// placed here that runs nowhere is off: nothing moves it, and it gets its
// class when it starts here. The policy goes to the agent's Run loop
// (SetPolicy re-derives with the new VMs).
type agentSide struct {
	inv      *movableInventory // nil: the inventory finds the VMs itself (libvirt)
	mover    func(vm string) error
	policies chan<- *policy.Policy
	ctx      context.Context
	logf     func(format string, args ...any) // failed moves; nil: none
	admitter *agent.Admitter                  // the hook's answers: the policy and the VMs starting here
	mu       sync.Mutex
	stats    agent.Stats
	vms      func() []string
	unnamed  func() []string
	uuids    func() map[string]string // domain name → UUID
	failed   map[string]string        // VM → why its last move in failed, while the move is asked
	since    map[string]time.Time     // VM → when it was first seen running here
	lastVMs  []string                 // the running VMs of the last report or step
	changed  chan struct{}            // the running VMs changed: report now
}

// arrive carries out d's moves in and, on a lab host, sets the inventory's
// running VMs. It records failed moves for the reports and returns them
// joined (for the log); the agent goes on either way.
func (s *agentSide) arrive(d controller.DesiredHost) error {
	var errs []error
	failed := map[string]string{}
	if s.inv == nil {
		errs = s.migrateIn(d, failed)
	} else {
		have, _ := s.inv.VMs()
		var run []string
		for _, vm := range d.VMs {
			if !slices.Contains(have, vm) {
				if s.mover == nil {
					failed[vm] = "no executor for this inventory"
					errs = append(errs, fmt.Errorf("moving %s in: no executor for this inventory", vm))
					continue
				}
				if err := s.mover(vm); err != nil {
					failed[vm] = err.Error()
					errs = append(errs, fmt.Errorf("moving %s in: %w", vm, err))
					continue
				}
			}
			run = append(run, vm)
		}
		s.inv.setRunning(run)
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

// Apply takes a new desired state: moves carried out (or their failure
// recorded), then the host's part of the policy handed to the agent. Only
// a stopped agent is an error: a move that cannot be made is reported,
// not retried here (the controller decides again).
func (s *agentSide) Apply(d controller.DesiredHost) error {
	p := d.Policy
	if err := s.ctx.Err(); err != nil {
		return err
	}
	if err := s.arrive(d); err != nil && s.logf != nil {
		s.logf("%s", labOneLine(err))
	}
	if s.admitter != nil {
		s.admitter.Set(p, d.Starting)
	}
	select {
	case s.policies <- p:
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	return nil
}

// running returns the VMs that run here now.
func (s *agentSide) running() []string {
	var vms []string
	if s.inv != nil {
		vms, _ = s.inv.VMs()
	} else if s.vms != nil {
		vms = s.vms()
	}
	vms = slices.Clone(vms)
	sort.Strings(vms)
	return vms
}

// noteVMs notes the running VMs (when each was first seen) and, when they
// changed since the last note, signals Changed: the host reports at once
// (a VM started or destroyed behind sluice's back is reported within the
// agent's step).
func (s *agentSide) noteVMs() {
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
func (s *agentSide) signal() {
	if s.changed != nil {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// Changed is signalled when the host's running VMs changed.
func (s *agentSide) Changed() <-chan struct{} { return s.changed }

// setStats keeps the agent's last statistics for the reports, and notes
// the running VMs (each step).
func (s *agentSide) setStats(st agent.Stats) {
	s.mu.Lock()
	s.stats = st
	s.mu.Unlock()
	s.noteVMs()
}

func (s *agentSide) Report() controller.Report {
	s.mu.Lock()
	st := s.stats
	r := controller.Report{VMs: []string{}, Uplinks: []string{}, RatesBps: map[string]float64{}, Time: time.Now().UTC(),
		Since: map[string]time.Time{}, Failed: map[string]string{}}
	maps.Copy(r.Failed, s.failed)
	s.mu.Unlock()
	r.VMs = s.running()
	s.mu.Lock()
	for _, vm := range r.VMs {
		if t, ok := s.since[vm]; ok {
			r.Since[vm] = t
		}
	}
	s.mu.Unlock()
	if s.unnamed != nil {
		r.Unnamed = s.unnamed()
	}
	if s.uuids != nil && len(r.Unnamed) > 0 {
		all := s.uuids()
		r.UUIDs = map[string]string{}
		for _, d := range r.Unnamed {
			if u := all[d]; u != "" {
				r.UUIDs[d] = u
			}
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

// newAgentSide returns the executor side of an agent on the controller:
// a lab host gets a movableInventory (VMs re-plug between hosts) that
// replaces inv; a libvirt host keeps its inventory and migrates VMs in
// live as mig says.
func newAgentSide(src *inventoryFlags, mig *migrateFlags, pl *lab.Plan, host string, inv agent.Inventory, policies chan<- *policy.Policy) (*agentSide, agent.Inventory, error) {
	s := &agentSide{policies: policies, ctx: context.Background(), changed: make(chan struct{}, 1)}
	if u, ok := inv.(interface{ Unnamed() []string }); ok {
		s.unnamed = u.Unnamed
	}
	if u, ok := inv.(interface{ UUIDs() map[string]string }); ok {
		s.uuids = u.UUIDs
	}
	if src.kind != "lab" {
		s.vms = func() []string { vms, _ := inv.VMs(); return vms }
		s.mover = mig.mover(host, src.socket)
		return s, inv, nil
	}
	mi, err := newMovableInventory(pl, host)
	if err != nil {
		return nil, nil, err
	}
	s.inv = mi
	s.mover = func(vm string) error { return pl.Move(vm, host) }
	return s, mi, nil
}
