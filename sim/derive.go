package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/policy"
)

// resync derives the desired state of the cluster from s.cur and the live
// state (entitle.Derive: each VM's traffic leaves from s.vmHost, failed
// uplinks are down) and makes the uplinks match it: every scheduled vNIC
// is attached to the uplink the derivation names (moved when it names
// another), and the hclock parameters of the vNICs and the classes are
// the derivation's. System-class ports (HOST/CLASS) are the simulator's
// own traffic sources: they stay on the host's first uplink that is up.
// Call it after anything that can change the derivation: the start, an
// admitted change, a migration completing, an uplink failing. Errors of
// the scheduler are joined; the rest of the state is still applied.
func (s *Sim) resync() error {
	live := entitle.Live{Hosts: map[string]string{}, DownUplinks: map[string]bool{}}
	for vm, h := range s.vmHost {
		if h != "" {
			live.Hosts[vm] = h
		}
	}
	for _, u := range s.upOrder {
		if u.failed {
			live.DownUplinks[u.Host+"/"+u.Name] = true
		}
	}
	s.des = entitle.Derive(s.cur, live)
	var errs []error
	for i := range s.des.Uplinks {
		spec := &s.des.Uplinks[i]
		up := s.uplinks[spec.Host+"/"+spec.Uplink]
		up.tree = entitle.NewNet(&entitle.Desired{Uplinks: []entitle.UplinkSpec{*spec}})
		up.ent = nil
		for _, c := range spec.Classes {
			errs = append(errs, up.setParams("class:"+c.Class, c.ReservationBps, c.Shares, c.LimitBps))
			for _, v := range c.VNICs {
				errs = append(errs, s.attach(v.Port, "vm", up))
				errs = append(errs, up.setParams(v.Port, v.ReservationBps, v.Shares, v.LimitBps))
			}
		}
	}
	// What each uplink receives: its inbound tree (the vNICs receive
	// through the uplink they send by). A down uplink's inbound tree has
	// no vNIC.
	for i := range s.des.Inbound {
		spec := &s.des.Inbound[i]
		up := s.inUplinks[spec.Host+"/"+spec.Uplink]
		if up == nil {
			continue
		}
		up.tree = entitle.NewInboundNet(&entitle.Desired{Inbound: []entitle.UplinkSpec{*spec}})
		up.ent = nil
		for _, c := range spec.Classes {
			errs = append(errs, up.setParams("class:"+c.Class, c.ReservationBps, c.Shares, c.LimitBps))
			for _, v := range c.VNICs {
				errs = append(errs, s.attach(InPrefix+v.Port, "vm", up))
				errs = append(errs, up.setParams(InPrefix+v.Port, v.ReservationBps, v.Shares, v.LimitBps))
			}
		}
	}
	for _, name := range sortedKeys(s.ports) {
		pt := s.ports[name]
		if pt.class == "vm" || !pt.up.failed {
			continue
		}
		if up := s.firstUp(pt.up.Host); up != nil {
			errs = append(errs, s.attach(name, pt.class, up))
		}
	}
	return errors.Join(errs...)
}

// resyncLogged is resync for events: an error goes into the log.
func (s *Sim) resyncLogged() {
	if err := s.resync(); err != nil {
		s.logf("%v", err)
	}
}

// logf adds a line to the run's log, stamped with the simulated time.
func (s *Sim) logf(format string, a ...any) {
	s.Log = append(s.Log, fmt.Sprintf("%.1fs: ", float64(s.eng.NowNs())/1e9)+fmt.Sprintf(format, a...))
}

// firstUp is the host's first uplink that is up, or nil.
func (s *Sim) firstUp(host string) *Uplink {
	for _, u := range s.upOrder {
		if u.Host == host && !u.failed {
			return u
		}
	}
	return nil
}

// attach puts port name (of traffic class class) on up. A port that was on
// another uplink moves: the segments queued there drain there, and the
// senders blocked on its full queue send on up.
func (s *Sim) attach(name, class string, up *Uplink) error {
	old := s.ports[name]
	if old != nil && old.up == up {
		return nil
	}
	pt := &Port{Name: name, class: class, series: s.rec.Series(prefRate + name), vcpu: s.vcpus[vmOf(name)]}
	if err := up.addPort(pt); err != nil {
		return err
	}
	s.ports[name] = pt
	if old != nil {
		for _, w := range old.waiters {
			w()
		}
		old.waiters = nil
	}
	if up.hc != nil && !s.gauged[name] {
		s.gauged[name] = true
		s.rec.Gauge(prefEntitled+name, func() float64 {
			pt := s.ports[name]
			if pt == nil {
				return 0
			}
			return s.entitlements(pt.up)[name]
		})
	}
	return nil
}

// portFor returns the port a workload sends through: a scheduled vNIC
// (VM/NIC), or a system class of a host (HOST/CLASS), attached to the
// host's first uplink that is up when it has no port yet.
func (s *Sim) portFor(name string) (*Port, error) {
	if pt := s.ports[name]; pt != nil {
		return pt, nil
	}
	if port, ok := strings.CutPrefix(name, InPrefix); ok {
		if s.inUplinks == nil {
			return nil, fmt.Errorf("port %s receives nothing under control: no vNIC of the policy has ingress", port)
		}
		return nil, fmt.Errorf("port %s has no ingress setting (or its VM runs on no uplink): what it receives is not modelled", port)
	}
	first, rest, _ := strings.Cut(name, "/")
	if vm := s.cur.VM(first); vm != nil {
		for _, nic := range vm.NICs {
			if nic.Name != rest {
				continue
			}
			if nic.Passthrough {
				return nil, fmt.Errorf("port %s is passthrough: it bypasses the scheduler, and the simulator models traffic only through it", name)
			}
			return nil, fmt.Errorf("port %s is on no uplink (its host has none up)", name)
		}
		return nil, fmt.Errorf("unknown port %q (VM %s has no NIC %q)", name, first, rest)
	}
	if s.cur.Host(first) == nil {
		return nil, fmt.Errorf("unknown port %q (VM/NIC or HOST/CLASS)", name)
	}
	if rest == "vm" || s.cur.TrafficClass(rest) == nil {
		return nil, fmt.Errorf("unknown port %q: %q is no system traffic class (%s)", name, rest, strings.Join(systemClasses(), ", "))
	}
	up := s.firstUp(first)
	if up == nil {
		return nil, fmt.Errorf("host %s has no uplink up", first)
	}
	if err := s.attach(name, rest, up); err != nil {
		return nil, err
	}
	return s.ports[name], nil
}

func systemClasses() []string {
	var out []string
	for _, c := range policy.TrafficClassNames {
		if c != "vm" {
			out = append(out, c)
		}
	}
	return out
}

// entitlements computes with package entitle, over the tree the last
// derivation gives up, what every port of up is due now: every vNIC and
// every system class (HOST/CLASS), with unbounded demand when its port on
// up has a running workload or queued traffic and 0 otherwise. It is the
// reference the scheduler's rates are checked against.
func (s *Sim) entitlements(up *Uplink) map[string]float64 {
	now := s.eng.NowNs()
	if up.ent != nil && up.entAtNs == now {
		return up.ent
	}
	ent := map[string]float64{}
	if up.tree != nil {
		for _, pt := range up.tree.Ports {
			if pt.Kind == entitle.KindClass && pt.Class == "vm" {
				continue // its demand is its vNICs'
			}
			if err := up.tree.SetDemand(pt.Name, s.demand(up.prefix+pt.Name, up)); err != nil {
				s.logf("entitlements of %s/%s: %v", up.Host, up.Name, err)
			}
		}
		up.tree.Compute()
		for _, pt := range up.tree.Ports {
			if pt.Kind == entitle.KindVNIC || pt.Class != "vm" {
				ent[up.prefix+pt.Name] = pt.AllocBps()
			}
		}
	}
	up.ent, up.entAtNs = ent, now
	return ent
}

// demand is what port name asks of up: fixed (Entitlements), else
// unbounded when its port is on up and has a running workload or queued
// traffic, else 0.
func (s *Sim) demand(name string, up *Uplink) float64 {
	if d, ok := s.fixedDemand[name]; ok {
		return d
	}
	pt := s.ports[name]
	if pt == nil || pt.up != up {
		return 0
	}
	if s.active[name] > 0 || len(pt.queue) > pt.qhead {
		return alloc.Inf
	}
	return 0
}

// PortEntitlement is the entitlement of one vNIC on the uplink the
// simulator scheduled it on.
type PortEntitlement struct {
	Host, Uplink, Port string
	AllocBps           float64 // bits/s
}

// Entitlements builds the simulator's cluster from p (newSim, resync:
// every VM on the host p gives it; VMs without one run nowhere) and
// returns, computed by the simulator's own entitlements, what every vNIC
// it schedules is due, in uplink and tree order. demandBps gives demands
// in bits/s (alloc.Inf: unbounded) by "VM/NIC" or "HOST/CLASS" (a system
// class on every uplink of the host); a vNIC not named is busy (unbounded),
// a class not named is busy when p declares it and idle otherwise. A name
// that is no vNIC or system class of p is an error.
func Entitlements(p *policy.Policy, demandBps map[string]float64) ([]PortEntitlement, error) {
	sc := &Scenario{Name: "entitlements", Scheduler: "netioc", file: "entitlements", pol: p, sampleNs: Second}
	s, err := newSim(sc, RunSpec{})
	if err != nil {
		return nil, err
	}
	s.fixedDemand = map[string]float64{}
	for _, vm := range p.VMs {
		for _, nic := range vm.NICs {
			s.fixedDemand[policy.PortName(vm.Name, nic.Name)] = alloc.Inf
		}
	}
	for _, h := range p.Hosts {
		for _, c := range p.TrafficClasses {
			if c.Name != "vm" {
				d := 0.0
				if c.Declared {
					d = alloc.Inf
				}
				s.fixedDemand[policy.ClassName(h.Name, c.Name)] = d
			}
		}
	}
	for name, d := range demandBps {
		if _, ok := s.fixedDemand[name]; !ok {
			return nil, fmt.Errorf("%s: no such port (VM/NIC, or HOST/CLASS of a system class)", name)
		}
		if math.IsNaN(d) || d < 0 {
			return nil, fmt.Errorf("%s: demand must be ≥ 0", name)
		}
		s.fixedDemand[name] = d
	}
	var out []PortEntitlement
	for _, u := range s.des.Uplinks {
		up := s.uplinks[u.Host+"/"+u.Uplink]
		for _, c := range u.Classes {
			for _, v := range c.VNICs {
				if pt := s.ports[v.Port]; pt == nil || pt.up != up {
					return nil, fmt.Errorf("%s: derived on %s/%s but not attached there", v.Port, u.Host, u.Uplink)
				}
				out = append(out, PortEntitlement{Host: u.Host, Uplink: u.Uplink, Port: v.Port, AllocBps: s.entitlements(up)[v.Port]})
			}
		}
	}
	return out, nil
}
