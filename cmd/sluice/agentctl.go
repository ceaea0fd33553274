package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"sluice/agent"
	"sluice/controller"
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
	fs.StringVar(&f.server, "controller", "", "the controller's URL (https://HOST:PORT): follow its policy and desired state instead of --policy")
	fs.StringVar(&f.tokenFile, "token-file", "", "bearer token for the controller")
	fs.StringVar(&f.ca, "ca", "", "the controller's certificate (PEM)")
	f.mig.register(fs)
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

// startState reads the policy in force and host's desired state.
func (f *controllerFlags) startState(ctx context.Context, cl *controller.Client, host string) (*policy.Policy, controller.DesiredHost, error) {
	ps, err := cl.Policy(ctx)
	if err != nil {
		return nil, controller.DesiredHost{}, fmt.Errorf("controller %s: %w", f.server, err)
	}
	p, err := ps.Build()
	if err != nil {
		return nil, controller.DesiredHost{}, err
	}
	d, err := cl.WatchDesired(ctx, host, 0, 0)
	if err != nil {
		return nil, controller.DesiredHost{}, fmt.Errorf("controller %s: %w", f.server, err)
	}
	return p, d, nil
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
// executor side of a migration. VMs new in the desired state are moved
// in by mover (the lab re-plugs their vNICs or migrates its guests; a
// libvirt host migrates them live from the peer that runs them,
// agentmigrate.go), VMs gone from it are let go (their
// destination's agent takes their vNICs), and the policy goes to the
// agent's Run loop (SetPolicy re-derives with the new VMs).
type agentSide struct {
	inv      *movableInventory // nil: the inventory finds the VMs itself (libvirt)
	mover    func(vm string) error
	policies chan<- *policy.Policy
	ctx      context.Context
	mu       sync.Mutex
	stats    agent.Stats
	vms      func() []string
}

// arrive moves in the desired VMs not running here and sets the
// inventory's running VMs.
func (s *agentSide) arrive(d controller.DesiredHost) error {
	if s.inv == nil {
		return s.migrateIn(d)
	}
	have, _ := s.inv.VMs()
	var run []string
	var errs []error
	for _, vm := range d.VMs {
		if !slices.Contains(have, vm) && s.mover != nil {
			if err := s.mover(vm); err != nil {
				errs = append(errs, fmt.Errorf("moving %s in: %w", vm, err))
				continue
			}
		} else if !slices.Contains(have, vm) {
			errs = append(errs, fmt.Errorf("moving %s in: no executor for this inventory", vm))
			continue
		}
		run = append(run, vm)
	}
	s.inv.setRunning(run)
	return errors.Join(errs...)
}

func (s *agentSide) Apply(p *policy.Policy, d controller.DesiredHost) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	err := s.arrive(d)
	select {
	case s.policies <- p:
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	return err
}

// setStats keeps the agent's last statistics for the reports.
func (s *agentSide) setStats(st agent.Stats) {
	s.mu.Lock()
	s.stats = st
	s.mu.Unlock()
}

func (s *agentSide) Report() controller.Report {
	s.mu.Lock()
	st := s.stats
	s.mu.Unlock()
	r := controller.Report{VMs: []string{}, Uplinks: []string{}, RatesBps: map[string]float64{}, Time: time.Now().UTC()}
	if s.inv != nil {
		r.VMs, _ = s.inv.VMs()
	} else if s.vms != nil {
		r.VMs = s.vms()
	}
	for _, u := range st.Uplinks {
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
func newAgentSide(src *inventoryFlags, mig *migrateFlags, p *policy.Policy, host string, inv agent.Inventory, policies chan<- *policy.Policy) (*agentSide, agent.Inventory, error) {
	s := &agentSide{policies: policies, ctx: context.Background()}
	if src.kind != "lab" {
		s.vms = func() []string { vms, _ := inv.VMs(); return vms }
		s.mover = mig.mover(host, src.socket)
		return s, inv, nil
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		return nil, nil, err
	}
	mi, err := newMovableInventory(pl, host)
	if err != nil {
		return nil, nil, err
	}
	s.inv = mi
	s.mover = func(vm string) error { return pl.Move(vm, host) }
	return s, mi, nil
}
