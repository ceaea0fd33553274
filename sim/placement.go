package sim

import (
	"fmt"
	"strings"

	"sluice/placement"

	"sluice/policy"
)

// vmBudget is what the vNIC reservations on an uplink may add up to: the
// vm class reservation when the policy declares one, else reservationCap
// × line rate less the other classes' reservations (DESIGN.md §2).
func (s *Sim) vmBudget(up *Uplink) float64 {
	vi := s.classIndex("vm")
	if r := s.pol.TrafficClasses[vi].Reservation; r > 0 {
		return float64(r)
	}
	b := s.pol.ReservationCap * up.LineBps
	for i, c := range s.pol.TrafficClasses {
		if i != vi {
			b -= float64(c.Reservation)
		}
	}
	return b
}

// reserved is the sum of vNIC reservations on up.
func (s *Sim) reserved(up *Uplink) float64 {
	sum := 0.0
	for n, u := range s.portUp {
		if u == up && s.ports[n].class == s.classIndex("vm") {
			sum += s.portRSL[n].res
		}
	}
	return sum
}

// drs is a placement pass of package placement over the cluster as it is
// now (current reservations, hosts and lost uplinks), repairing faults
// only (migration threshold 1); its migrations are carried out.
func (s *Sim) drs() {
	p := *s.cur
	p.VMs = append([]policy.VM(nil), s.cur.VMs...)
	cur := s.placementNow()
	for i := range p.VMs {
		p.VMs[i].Host = cur[p.VMs[i].Name]
	}
	opts := placement.Options{Threshold: 1, Changed: s.changed, VMotionBps: s.vmotion, NowNs: s.eng.NowNs()}
	for _, u := range s.upOrder {
		if u.failed {
			opts.DownUplinks = append(opts.DownUplinks, u.Host+"/"+u.Name)
		}
	}
	res := placement.Plan(&p, cur, placement.Demand{}, opts)
	now := float64(s.eng.NowNs()) / 1e9
	for _, d := range res.Decisions {
		s.Log = append(s.Log, fmt.Sprintf("%.1fs: placement: %s", now, strings.SplitN(d.String(), "\n", 2)[0]))
		if d.IsMove() && s.vmHost[d.VM] == d.From {
			s.migrate(d.VM, d.To)
		}
	}
}

func gbps(v float64) string { return fmt.Sprintf("%.2fGbps", v/1e9) }

// migrate moves a VM: its memory crosses the source host's vmotion class
// (at most the vMotion rate), then its ports move to the destination.
func (s *Sim) migrate(vm, to string) {
	from := s.vmHost[vm]
	if from == to {
		return
	}
	s.vmHost[vm] = "→" + to // in flight: the next DRS pass leaves it alone
	mem := int64(2 << 30)
	if v := s.pol.VM(vm); v != nil && v.Memory > 0 {
		mem = int64(v.Memory)
	}
	done := func() {
		s.vmHost[vm] = to
		for _, name := range sortedKeys(s.portRSL) {
			if vmOf(name) != vm || s.pol.Host(vm) != nil {
				continue
			}
			old := s.ports[name]
			if old == nil {
				continue
			}
			oldUp := s.portUp[name]
			delete(s.portUp, name)
			s.syncClass(oldUp)
			pin := ""
			if v := s.pol.VM(vm); v != nil {
				for _, n := range v.NICs {
					if policy.PortName(vm, n.Name) == name {
						pin = n.Uplink
					}
				}
			}
			s.attachPort(name, to, pin)
			// Segments still queued on the old uplink drain there.
			for _, w := range old.waiters {
				w()
			}
			old.waiters = nil
		}
		s.Log = append(s.Log, fmt.Sprintf("%.1fs: %s now on %s", float64(s.eng.NowNs())/1e9, vm, to))
	}
	pt, err := s.portFor(from + "/vmotion")
	if err != nil || s.vmotion <= 0 {
		done()
		return
	}
	wl := &workload{spec: WorkloadSpec{Name: "vmotion-" + vm, Type: "transfer", Port: pt.Name, Streams: 2,
		Window: "256KiB", Bytes: fmt.Sprint(mem), Rate: fmt.Sprintf("%.0fbps", s.vmotion)}}
	s.loadList = append(s.loadList, wl)
	if err := s.startLoad(wl); err != nil {
		done()
		return
	}
	for _, st := range wl.streams {
		prev := st.onDone
		st.onDone = func() {
			prev()
			if !wl.running {
				done()
			}
		}
	}
}

// failUplink takes an uplink down; its ports move to another uplink of
// the host (teaming failover) when there is one.
func (s *Sim) failUplink(up *Uplink) {
	up.failed = true
	s.Log = append(s.Log, fmt.Sprintf("%.1fs: uplink %s/%s failed", float64(s.eng.NowNs())/1e9, up.Host, up.Name))
	for _, name := range sortedKeys(s.portUp) {
		if s.portUp[name] != up {
			continue
		}
		host := up.Host
		if h := s.vmHost[vmOf(name)]; h != "" {
			host = h
		}
		s.attachPort(name, host, "")
	}
}
