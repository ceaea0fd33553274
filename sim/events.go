package sim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"sluice/alloc"
	"sluice/placement"
	"sluice/policy"
)

// maxRequests bounds the exchanges of one rr operation.
const maxRequests = 10_000

func (s *Sim) addWorkload(w WorkloadSpec) error {
	if w.Name == "" {
		return lineErr(s.file, w.Line, "name", "a workload needs a name")
	}
	if s.loads[w.Name] != nil {
		return lineErr(s.file, w.Line, "name", "workload %q given twice", w.Name)
	}
	switch w.Direction {
	case "", "out":
	case "in":
		if w.Type != "bulk" && w.Type != "transfer" {
			return lineErr(s.file, w.Line, "direction", "only bulk and transfer workloads can be inbound, not %s", w.Type)
		}
		w.Port = InPrefix + w.Port // the fabric sends: no vCPU of the VM does the work
	default:
		return lineErr(s.file, w.Line, "direction", "unknown direction %q (out, in)", w.Direction)
	}
	wl := &workload{spec: w}
	switch w.Type {
	case "bulk", "transfer", "rr":
		if _, err := s.portFor(w.Port); err != nil {
			return lineErr(s.file, w.Line, "port", "%v", err)
		}
		if w.Type == "rr" {
			resp, err := parseSize(w.Response, 64)
			if err != nil {
				return lineErr(s.file, w.Line, "response", "%v", err)
			}
			srv, err := durNs(w.ServerTime, 0)
			if err != nil {
				return lineErr(s.file, w.Line, "serverTime", "%v", err)
			}
			think, err := durNs(w.Think, 0)
			if err != nil {
				return lineErr(s.file, w.Line, "think", "%v", err)
			}
			if w.Requests < 0 || w.Requests > maxRequests {
				return lineErr(s.file, w.Line, "requests", "%d: want 1 to %d exchanges per operation", w.Requests, maxRequests)
			}
			n := int64(max(w.Requests, 1))
			wl.rr = &rr{s: s, respBytes: max(resp/n, 1), serverNs: srv / n, thinkNs: think, exchanges: int(n), series: s.rec.Series(prefRR + w.Name)}
			break
		}
		var err error
		if wl.windowBytes, err = parseSize(w.Window, 64<<10); err != nil {
			return lineErr(s.file, w.Line, "window", "%v", err)
		}
		if wl.rateBps, err = parseRate(w.Rate, 0); err != nil {
			return lineErr(s.file, w.Line, "rate", "%v", err)
		}
		wl.totalBytes = -1
		if w.Type == "transfer" {
			if wl.totalBytes, err = parseSize(w.Bytes, 1<<30); err != nil {
				return lineErr(s.file, w.Line, "bytes", "%v", err)
			}
		}
	case "oltp", "iometer":
		d := s.disks[w.Disk]
		if d == nil {
			return lineErr(s.file, w.Line, "disk", "unknown disk %q (VM/DISK on a datastore of the policy)", w.Disk)
		}
		size, err := parseSize(w.IOSize, 8192)
		if err != nil {
			return lineErr(s.file, w.Line, "ioSize", "%v", err)
		}
		if w.Type == "oltp" {
			think, err := durNs(w.Think, 500_000_000)
			if err != nil {
				return lineErr(s.file, w.Line, "think", "%v", err)
			}
			wl.oltp = &oltp{s: s, disk: d, users: max(w.Users, 1), thinkNs: think, ios: max(w.IOsPerOrder, 1), ioBytes: size,
				orders: s.rec.Series(prefOrders + w.Name), orderT: s.rec.Series(prefOrderT + w.Name)}
		} else {
			wl.iom = &iometer{disk: d, outstanding: max(w.Outstanding, 1), ioBytes: size}
		}
	}
	s.loads[w.Name] = wl
	s.loadList = append(s.loadList, wl)
	return nil
}

// startLoad starts a workload (no-op when running).
func (s *Sim) startLoad(wl *workload) {
	if wl.running {
		return
	}
	w := wl.spec
	wl.running = true
	switch w.Type {
	case "bulk", "transfer":
		s.active[w.Port]++
		total := wl.totalBytes
		n := max(w.Streams, 1)
		wl.streams = nil
		left := n
		for i := range n {
			st := &stream{s: s, portName: w.Port, cpu: s.vcpus[vmOf(w.Port)], window: max(wl.windowBytes, s.net.SegmentBytes),
				remaining: total, rateBps: wl.rateBps / float64(n)}
			if total > 0 {
				st.remaining = total / int64(n)
				if i == 0 {
					st.remaining += total % int64(n)
				}
				st.onDone = func() {
					left--
					if left == 0 {
						s.stopLoad(wl)
					}
				}
			}
			wl.streams = append(wl.streams, st)
		}
		for _, st := range wl.streams {
			st.start()
		}
	case "rr":
		s.active[w.Port]++
		wl.rr.active = true
		wl.rr.portName = w.Port
		wl.rr.cpu = s.vcpus[vmOf(w.Port)]
		for range max(w.Users, 1) {
			wl.rr.user()
		}
	case "oltp":
		wl.oltp.start()
	case "iometer":
		wl.iom.start()
	}
}

func (s *Sim) stopLoad(wl *workload) {
	if !wl.running {
		return
	}
	wl.running = false
	switch wl.spec.Type {
	case "bulk", "transfer":
		for _, st := range wl.streams {
			st.active = false
		}
		s.active[wl.spec.Port]--
	case "rr":
		wl.rr.active = false
		s.active[wl.spec.Port]--
	case "oltp":
		wl.oltp.active = false
	case "iometer":
		wl.iom.active = false
	}
}

// A timelineEvent is one timeline event, checked and parsed once when a run is
// set up: do carries it out with the values parsed then.
type timelineEvent struct {
	line int
	atNs int64
	do   func() error
}

// schedule parses a timeline event and puts it on the engine; what it
// fails to do at its time is logged.
func (s *Sim) schedule(e EventSpec) error {
	ev, err := s.parseEvent(e)
	if err != nil {
		return err
	}
	s.eng.At(ev.atNs, func() {
		if err := ev.do(); err != nil {
			s.logf("%s:%d: %v", s.file, ev.line, err)
		}
	})
	return nil
}

// parseEvent checks an event and returns what it does.
func (s *Sim) parseEvent(e EventSpec) (timelineEvent, error) {
	ev := timelineEvent{line: e.Line}
	var err error
	if ev.atNs, err = durNs(e.At, 0); err != nil {
		return ev, lineErr(s.file, e.Line, "at", "%v", err)
	}
	if ev.do, err = s.action(e); err != nil {
		return ev, lineErr(s.file, e.Line, "event", "%v", err)
	}
	return ev, nil
}

// action checks an event and returns what it does.
func (s *Sim) action(e EventSpec) (func() error, error) {
	switch {
	case e.Start != "" || e.Stop != "":
		name := e.Start + e.Stop
		wl := s.loads[name]
		if wl == nil {
			return nil, fmt.Errorf("unknown workload %q", name)
		}
		if e.Start != "" {
			return func() error { s.startLoad(wl); return nil }, nil
		}
		return func() error { s.stopLoad(wl); return nil }, nil
	case e.Set != "" && e.CPULimit != "":
		vm := e.Set
		c := s.vcpus[vm]
		if c == nil {
			return nil, fmt.Errorf("unknown VM %q", vm)
		}
		mhz, err := s.parseCPULimit(vm, e.CPULimit)
		if err != nil {
			return nil, err
		}
		return func() error {
			if mhz == 0 {
				peak := s.cpu.PeakMHz
				if peak == 0 {
					peak = float64(s.pol.Host(s.vmHost[vm]).CPU.MHz)
				}
				c.setMHz(peak)
			} else {
				c.setMHz(mhz)
			}
			return nil
		}, nil
	case e.Set != "":
		if d := s.disks[e.Set]; d != nil {
			return s.setDisk(d, e)
		}
		return s.setVNIC(e)
	case e.Migrate != "":
		if s.vmHost[e.Migrate] == "" || s.pol.Host(e.To) == nil {
			return nil, fmt.Errorf("migrate needs a VM and a destination host (to)")
		}
		vm, to := e.Migrate, e.To
		return func() error { s.migrate(vm, to); return nil }, nil
	case e.DRS:
		return func() error { s.drs(); return nil }, nil
	case e.Fail != "":
		up := s.uplinks[e.Fail]
		if up == nil {
			return nil, fmt.Errorf("unknown uplink %q (HOST/UPLINK)", e.Fail)
		}
		return func() error { return s.failUplink(up) }, nil
	case e.PowerOn != "":
		vm := e.PowerOn
		if s.vmHost[vm] == "" {
			return nil, fmt.Errorf("unknown VM %q", vm)
		}
		return func() error {
			for _, wl := range s.loadList {
				if vmOf(wl.spec.Port+wl.spec.Disk) == vm && wl.spec.Start == "never" {
					s.startLoad(wl)
				}
			}
			return nil
		}, nil
	case e.SIOC != "":
		ds := s.dstores[e.SIOC]
		if ds == nil {
			return nil, fmt.Errorf("unknown datastore %q", e.SIOC)
		}
		th, err := durNs(e.Threshold, int64(ds.threshNs))
		if err != nil {
			return nil, err
		}
		on := e.Enabled == nil || *e.Enabled
		return func() error { ds.sioc, ds.threshNs = on, float64(th); ds.policyChanged(); return nil }, nil
	}
	return nil, fmt.Errorf("no action (start, stop, set, migrate, drs, fail, powerOn, sioc)")
}

// setVNIC parses a change of a vNIC's reservation, limit and shares into
// package placement's changes. At its time the changes pass placement's
// admission together (admit) and the uplinks follow the new policy
// (resync).
func (s *Sim) setVNIC(e EventSpec) (func() error, error) {
	port := e.Set
	vmName, nicName, _ := strings.Cut(port, "/")
	vm := s.pol.VM(vmName)
	if vm == nil || nicName == "" || !hasNIC(vm, nicName) {
		return nil, fmt.Errorf("set: unknown %q (VM/NIC, VM/DISK, or VM with cpuLimit; the simulator changes no traffic class)", port)
	}
	var changes []placement.Change
	for _, f := range []struct{ field, value string }{{"reservation", e.Reservation}, {"limit", e.Limit}, {"shares", e.Shares}} {
		if f.value == "" {
			continue
		}
		c, err := placement.ParseChange(port + "." + f.field + "=" + f.value)
		if err != nil {
			return nil, err
		}
		// A bad value is an error of the scenario; a refusal depends on
		// the cluster at the time of the event.
		var refused *placement.RefusedError
		if _, _, err := c.Apply(s.pol, nil); err != nil && !errors.As(err, &refused) {
			return nil, err
		}
		changes = append(changes, c)
	}
	if len(changes) == 0 {
		return nil, fmt.Errorf("set %s: give reservation, limit or shares", port)
	}
	return func() error {
		old := nicReservation(s.cur, port)
		if err := s.admit(changes); err != nil {
			return err
		}
		if nicReservation(s.cur, port) > old {
			s.changed = append(s.changed, vmName)
		}
		return s.resync()
	}, nil
}

func hasNIC(vm *policy.VM, name string) bool {
	for _, n := range vm.NICs {
		if n.Name == name {
			return true
		}
	}
	return false
}

// nicReservation is the reservation of vNIC port (VM/NIC) in p.
func nicReservation(p *policy.Policy, port string) policy.Bps {
	vmName, nicName, _ := strings.Cut(port, "/")
	if vm := p.VM(vmName); vm != nil {
		for _, n := range vm.NICs {
			if n.Name == nicName {
				return n.Reservation
			}
		}
	}
	return 0
}

// setDisk parses a change of a disk's shares, reservation and limit
// (IOPS); at its time the values given replace the disk's in mclock.
// Package placement has no change of a disk's shares, so disk changes go
// to the disk's scheduler directly, not through s.cur.
func (s *Sim) setDisk(d *diskState, e EventSpec) (func() error, error) {
	var shares, res, limit *float64
	if e.Shares != "" {
		v, err := parseShares(e.Shares, 0, policy.StorageSharesLow, policy.StorageSharesNormal, policy.StorageSharesHigh)
		if err != nil {
			return nil, err
		}
		shares = &v
	}
	if e.Reservation != "" {
		v, err := strconv.ParseFloat(e.Reservation, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad IOPS %q", e.Reservation)
		}
		res = &v
	}
	if e.Limit != "" {
		v := alloc.Inf
		if e.Limit != "unlimited" {
			var err error
			if v, err = strconv.ParseFloat(e.Limit, 64); err != nil || v < 0 {
				return nil, fmt.Errorf("bad IOPS %q", e.Limit)
			}
			if v == 0 {
				return nil, fmt.Errorf("limit: %s", policy.ZeroLimitMessage)
			}
		}
		limit = &v
	}
	return func() error {
		c := d.params
		for _, f := range []struct{ dst, v *float64 }{{&c.Shares, shares}, {&c.ReservationIOPS, res}, {&c.LimitIOPS, limit}} {
			if f.v != nil {
				*f.dst = *f.v
			}
		}
		return d.setParams(c)
	}, nil
}

func parseShares(v string, def float64, low, normal, high int) (float64, error) {
	switch v {
	case "":
		return def, nil
	case "low":
		return float64(low), nil
	case "normal":
		return float64(normal), nil
	case "high":
		return float64(high), nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("bad shares %q", v)
	}
	return f, nil
}

// admit makes changes to s.cur when package placement's admission rules
// (R ≤ L, pool quotas, a reservation that fits no uplink) allow them all:
// a refused change is returned and nothing is made, as the controller
// would. A change that only breaks its host is a fault for the next
// placement pass.
func (s *Sim) admit(changes []placement.Change) error {
	np := s.cur
	for _, c := range changes {
		var err error
		if np, _, err = c.Apply(np, s.placementNow()); err != nil {
			return err
		}
	}
	s.cur = np
	return nil
}

// placementNow is where every VM runs (a VM in flight counts at its
// destination).
func (s *Sim) placementNow() placement.Placement {
	cur := placement.Placement{}
	for vm, h := range s.vmHost {
		if to := s.moving[vm]; to != "" {
			h = to
		}
		if h != "" {
			cur[vm] = h
		}
	}
	return cur
}
