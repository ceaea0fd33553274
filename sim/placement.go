package sim

import (
	"fmt"
	"strings"

	"sluice/placement"
	"sluice/policy"
)

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
	for _, d := range res.Decisions {
		s.logf("placement: %s", strings.SplitN(d.String(), "\n", 2)[0])
		if d.IsMove() && s.moving[d.VM] == "" && s.vmHost[d.VM] == d.From {
			s.migrate(d.VM, d.To)
		}
	}
}

func gbps(v float64) string { return fmt.Sprintf("%.2fGbps", v/1e9) }

// migrate moves a VM: its memory crosses the source host's vmotion class
// (at most the vMotion rate); its traffic leaves from the source until
// the move is done, then from the destination (resync).
func (s *Sim) migrate(vm, to string) {
	from := s.vmHost[vm]
	if from == to {
		return
	}
	if dest := s.moving[vm]; dest != "" {
		s.logf("migrate %s to %s: already moving to %s", vm, to, dest)
		return
	}
	s.moving[vm] = to // in flight: the next DRS pass leaves it alone
	mem := int64(2 << 30)
	if v := s.cur.VM(vm); v != nil && v.Memory > 0 {
		mem = int64(v.Memory)
	}
	done := func() {
		delete(s.moving, vm)
		s.vmHost[vm] = to
		// Segments still queued on the old uplinks drain there.
		s.resyncLogged()
		s.logf("%s now on %s", vm, to)
	}
	pt, err := s.portFor(from + "/vmotion")
	if err != nil || s.vmotion <= 0 {
		done()
		return
	}
	wl := &workload{spec: WorkloadSpec{Name: "vmotion-" + vm, Type: "transfer", Port: pt.Name, Streams: 2},
		windowBytes: 256 << 10, totalBytes: mem, rateBps: s.vmotion}
	s.loadList = append(s.loadList, wl)
	s.startLoad(wl)
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

// failUplink takes an uplink down; its ports move to the host's other
// uplinks (teaming failover) when there are any: vNICs where the
// derivation puts them, system classes to the first uplink up.
func (s *Sim) failUplink(up *Uplink) error {
	up.failed = true
	s.logf("uplink %s/%s failed", up.Host, up.Name)
	return s.resync()
}
