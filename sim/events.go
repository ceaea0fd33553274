package sim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"sluice/placement"
	"sluice/policy"
)

func (s *Sim) addWorkload(w WorkloadSpec) error {
	if w.Name == "" {
		return lineErr(s.file, w.Line, "name", "a workload needs a name")
	}
	if s.loads[w.Name] != nil {
		return lineErr(s.file, w.Line, "name", "workload %q given twice", w.Name)
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
			wl.rr = &rr{s: s, respBytes: resp, serverNs: srv, thinkNs: think, series: s.rec.Series(prefRR + w.Name)}
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
func (s *Sim) startLoad(wl *workload) error {
	if wl.running {
		return nil
	}
	w := wl.spec
	wl.running = true
	switch w.Type {
	case "bulk", "transfer":
		s.active[w.Port]++
		s.syncPort(w.Port)
		win, err := parseSize(w.Window, 64<<10)
		if err != nil {
			return err
		}
		rate, err := parseRate(w.Rate, 0)
		if err != nil {
			return err
		}
		total := int64(-1)
		if w.Type == "transfer" {
			if total, err = parseSize(w.Bytes, 1<<30); err != nil {
				return err
			}
		}
		n := max(w.Streams, 1)
		wl.streams = nil
		left := n
		for i := range n {
			st := &stream{s: s, port: nil, cpu: s.vcpus[vmOf(w.Port)], window: max(win, s.net.SegmentBytes), remaining: total, rateBps: rate / float64(n)}
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
			st.portName = w.Port
			wl.streams = append(wl.streams, st)
		}
		for _, st := range wl.streams {
			st.start()
		}
	case "rr":
		s.active[w.Port]++
		s.syncPort(w.Port)
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
	return nil
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
		s.syncPort(wl.spec.Port)
	case "rr":
		wl.rr.active = false
		s.active[wl.spec.Port]--
		s.syncPort(wl.spec.Port)
	case "oltp":
		wl.oltp.active = false
	case "iometer":
		wl.iom.active = false
	}
}

// schedule puts one timeline event on the engine.
func (s *Sim) schedule(e EventSpec) error {
	at, err := durNs(e.At, 0)
	if err != nil {
		return lineErr(s.file, e.Line, "at", "%v", err)
	}
	act, err := s.action(e)
	if err != nil {
		return lineErr(s.file, e.Line, "event", "%v", err)
	}
	s.eng.At(at, func() {
		if err := act(); err != nil {
			s.Log = append(s.Log, fmt.Sprintf("%.1fs: %v", float64(s.eng.NowNs())/1e9, err))
		}
	})
	return nil
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
			return func() error { return s.startLoad(wl) }, nil
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
		if _, ok := s.portRSL[e.Set]; !ok {
			if _, err := s.portFor(e.Set); err != nil {
				return nil, err
			}
		}
		// Check the values now; apply them on top of the port's settings
		// at the time of the event.
		if _, err := parseRate(e.Reservation, 0); err != nil {
			return nil, err
		}
		if _, err := parseRate(e.Limit, 0); err != nil {
			return nil, err
		}
		if _, err := parseShares(e.Shares, 0, 1, 1, 1); err != nil {
			return nil, err
		}
		name := e.Set
		return func() error {
			if err := s.admit(name, e); err != nil {
				return err
			}
			r := *s.portRSL[name]
			r.res, _ = parseRate(e.Reservation, r.res)
			r.limit, _ = parseRate(e.Limit, r.limit)
			r.shares, _ = parseShares(e.Shares, r.shares, policy.NetSharesLow, policy.NetSharesNormal, policy.NetSharesHigh)
			old := s.portRSL[name].res
			*s.portRSL[name] = r
			if r.res > old {
				s.changed = append(s.changed, vmOf(name))
			}
			s.syncPort(name)
			return nil
		}, nil
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
		return func() error { s.failUplink(up); return nil }, nil
	case e.PowerOn != "":
		vm := e.PowerOn
		if s.vmHost[vm] == "" {
			return nil, fmt.Errorf("unknown VM %q", vm)
		}
		return func() error {
			for _, wl := range s.loadList {
				if vmOf(wl.spec.Port+wl.spec.Disk) == vm && wl.spec.Start == "never" {
					if err := s.startLoad(wl); err != nil {
						return err
					}
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
		return func() error { ds.sioc, ds.threshNs = on, float64(th); return nil }, nil
	}
	return nil, fmt.Errorf("no action (start, stop, set, migrate, drs, fail, powerOn, sioc)")
}

func (s *Sim) setDisk(d *diskState, e EventSpec) (func() error, error) {
	c := d.params
	var err error
	if e.Shares != "" {
		if c.Shares, err = parseShares(e.Shares, c.Shares, policy.StorageSharesLow, policy.StorageSharesNormal, policy.StorageSharesHigh); err != nil {
			return nil, err
		}
	}
	if e.Reservation != "" {
		if c.ReservationIOPS, err = strconv.ParseFloat(e.Reservation, 64); err != nil {
			return nil, fmt.Errorf("bad IOPS %q", e.Reservation)
		}
	}
	if e.Limit != "" {
		if e.Limit == "unlimited" {
			c.LimitIOPS = math.Inf(1)
		} else if c.LimitIOPS, err = strconv.ParseFloat(e.Limit, 64); err != nil {
			return nil, fmt.Errorf("bad IOPS %q", e.Limit)
		}
	}
	return func() error { d.setParams(c); return nil }, nil
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

// admit checks a change of a vNIC's settings with package placement's
// admission rules (R ≤ L, pool quotas, a reservation that fits no uplink):
// a refused change is logged and not made, as the controller would. A
// change that only breaks its host is a fault for the next placement pass.
func (s *Sim) admit(port string, e EventSpec) error {
	vm := s.pol.VM(vmOf(port))
	if vm == nil {
		return nil // a system class: not a placement matter
	}
	np := s.cur
	for _, f := range []struct{ field, value string }{{"reservation", e.Reservation}, {"limit", e.Limit}, {"shares", e.Shares}} {
		if f.value == "" {
			continue
		}
		c, err := placement.ParseChange(port + "." + f.field + "=" + f.value)
		if err != nil {
			return err
		}
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
		cur[vm] = strings.TrimPrefix(h, "→")
	}
	return cur
}
