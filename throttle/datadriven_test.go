package throttle

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/parda"
	"sluice/policy"
)

// fakeDisk is one disk of a domain of the fake libvirt.
type fakeDisk struct {
	vm, target, serial string
	c                  Counters
	tune               Limits
	sets               int
}

// fakeHV is a stateful fake libvirt: domains' disks with cumulative
// counters and throttles; it renders its state as text.
type fakeHV struct {
	disks   []*fakeDisk
	stopped map[string]bool
	setLog  []string
}

func (f *fakeHV) find(vm, target string) *fakeDisk {
	for _, d := range f.disks {
		if d.vm == vm && d.target == target && !f.stopped[vm] {
			return d
		}
	}
	return nil
}

func (f *fakeHV) BlockStats(vms []string) ([]HostDisk, error) {
	var out []HostDisk
	for _, d := range f.disks {
		if slices.Contains(vms, d.vm) && !f.stopped[d.vm] {
			out = append(out, HostDisk{VM: d.vm, Target: d.target, Serial: d.serial, Counters: d.c})
		}
	}
	return out, nil
}

func (f *fakeHV) IOTune(vm, target string) (Limits, error) {
	d := f.find(vm, target)
	if d == nil {
		return Limits{}, fmt.Errorf("domain %s has no disk %s", vm, target)
	}
	return d.tune, nil
}

func (f *fakeHV) SetIOTune(vm, target string, l Limits) error {
	d := f.find(vm, target)
	if d == nil {
		return fmt.Errorf("domain %s has no disk %s", vm, target)
	}
	d.tune = l
	d.sets++
	f.setLog = append(f.setLog, fmt.Sprintf("%s %s iops=%d", vm, target, l.IOPS))
	return nil
}

// fakeStats is the datastore's stats: this host's record as written,
// the other hosts' as the test gives them.
type fakeStats struct{ recs []parda.Record }

func (s *fakeStats) Read() ([]parda.Record, error) { return slices.Clone(s.recs), nil }
func (s *fakeStats) Write(r parda.Record) error {
	for i := range s.recs {
		if s.recs[i].Host == r.Host {
			s.recs[i] = r
			return nil
		}
	}
	s.recs = append(s.recs, r)
	return nil
}

// TestDataDriven runs testdata/*.txt: a fake libvirt (counters in,
// throttles out) and a fake stats file around Driver. Commands:
//
//	setup host=H [sioc=off] [threshold=D] [minWindow=N] [maxWindow=N]
//	VM/DISK [r=IOPS] [s=SHARES] [l=IOPS] [target=vda] [serial=DISK]   (one per line; serial= for none)
//
//	period [dt=1s]
//	VM/DISK ops=N|throttle [lat=D] [bytes=N] [reset]   (one per line: this period's I/O)
//	record HOST ios=N lat=D window=W shares=S          (another host's record)
//	probe n=N lat=D                                    (the host's probes of the datastore)
//
// ops=throttle does exactly the disk's current throttle (a disk that
// wants more); bytes default to 4 KiB per op; reset restarts the disk's
// counters first (a new QEMU process, whose throttle is its domain's).
//
//	stop vm=VM | start vm=VM | plug (lines as in setup) | uninstall
//
// Every period prints the host's window and budget, every disk's rate,
// latency, demand, entitlement and throttle, and the throttles set; the
// harness checks that limits hold and reservations are kept and prints
// any violation with "<--".
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var (
			drv   *Driver
			hv    *fakeHV
			st    *fakeStats
			specs []entitle.DiskSpec
			nowNs int64
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "setup":
				hv, st, specs, nowNs = &fakeHV{stopped: map[string]bool{}}, &fakeStats{}, nil, 1_700_000_000e9
				var host string
				d.ScanArgs(t, "host", &host)
				sioc := policy.SIOC{Enabled: true, CongestionThreshold: 12 * time.Millisecond}
				if d.HasArg("threshold") {
					var s string
					d.ScanArgs(t, "threshold", &s)
					sioc.CongestionThreshold = dur(t, d, s)
				}
				if d.HasArg("minWindow") {
					d.ScanArgs(t, "minWindow", &sioc.MinWindow)
				}
				if d.HasArg("maxWindow") {
					d.ScanArgs(t, "maxWindow", &sioc.MaxWindow)
				}
				drv = &Driver{Host: host, Datastore: "ds1", HV: hv, Stats: st, Ctl: sioc.Controller()}
				if d.HasArg("sioc") {
					drv.Ctl = nil
				}
				specs = plug(t, d, hv, specs)
				return "ok\n"
			case "plug":
				specs = plug(t, d, hv, specs)
				return "ok\n"
			case "stop", "start":
				var vm string
				d.ScanArgs(t, "vm", &vm)
				hv.stopped[vm] = d.Cmd == "stop"
				if d.Cmd == "start" { // a new QEMU process: counters from 0, the domain's own throttle
					for _, k := range hv.disks {
						if k.vm == vm {
							k.c, k.tune = Counters{}, Limits{}
						}
					}
				}
				return "ok\n"
			case "uninstall":
				var vms []string
				for _, s := range specs {
					vms = append(vms, s.VM)
				}
				var b strings.Builder
				if err := drv.Restore(vms); err != nil {
					fmt.Fprintf(&b, "error: %v\n", err)
				}
				for _, k := range hv.disks {
					if !hv.stopped[k.vm] {
						fmt.Fprintf(&b, "%s %s iops=%d\n", k.vm, k.target, k.tune.IOPS)
					}
				}
				return b.String()
			case "period":
				dt := time.Second
				if d.HasArg("dt") {
					var s string
					d.ScanArgs(t, "dt", &s)
					dt = dur(t, d, s)
				}
				nowNs += dt.Nanoseconds()
				var others []parda.Record
				var probe *Probe
				for _, line := range lines(d.Input) {
					f := strings.Fields(line)
					kv := kvs(t, d, f[1:])
					if f[0] == "probe" {
						n := num(t, d, kv["n"])
						probe = &Probe{N: int(n), LatSumNs: n * float64(dur(t, d, kv["lat"]).Nanoseconds())}
						continue
					}
					if f[0] == "record" {
						ios := num(t, d, kv["ios"])
						lat := dur(t, d, kv["lat"])
						others = append(others, parda.Record{Host: f[1], PeriodEndNs: nowNs, PeriodNs: dt.Nanoseconds(), IOs: uint64(ios),
							NormLatSumNs: ios * float64(lat.Nanoseconds()), Window: num(t, d, kv["window"]), ActiveShares: num(t, d, kv["shares"])})
						continue
					}
					vm, dk, _ := strings.Cut(f[0], "/")
					var k *fakeDisk
					for _, x := range hv.disks {
						if x.vm == vm && (x.serial == dk || x.target == dk) {
							k = x
						}
					}
					if k == nil {
						d.Fatalf(t, "no disk %s", f[0])
					}
					if _, ok := kv["reset"]; ok {
						k.c = Counters{}
					}
					var ops float64
					if kv["ops"] == "throttle" {
						ops = float64(k.tune.IOPS) * dt.Seconds()
					} else {
						ops = num(t, d, kv["ops"])
					}
					bytes := ops * 4096
					if v, ok := kv["bytes"]; ok {
						bytes = num(t, d, v)
					}
					lat := time.Duration(0)
					if v, ok := kv["lat"]; ok {
						lat = dur(t, d, v)
					}
					k.c.Ops += uint64(ops)
					k.c.Bytes += uint64(bytes)
					k.c.TimeNs += uint64(ops * float64(lat.Nanoseconds()))
				}
				for _, r := range others {
					_ = st.Write(r)
				}
				hv.setLog = nil
				out, err := drv.Period(specs, nowNs, dt.Nanoseconds(), probe)
				return render(out, err, specs, hv)
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func plug(t *testing.T, d *datadriven.TestData, hv *fakeHV, specs []entitle.DiskSpec) []entitle.DiskSpec {
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		kv := kvs(t, d, f[1:])
		vm, dk, ok := strings.Cut(f[0], "/")
		if !ok {
			d.Fatalf(t, "%q: want VM/DISK", f[0])
		}
		s := entitle.DiskSpec{Name: f[0], VM: vm, Disk: dk, Host: "h", Shares: 1000, LimitIOPS: alloc.Inf}
		if v, ok := kv["r"]; ok {
			s.ReservationIOPS = num(t, d, v)
		}
		if v, ok := kv["s"]; ok {
			s.Shares = num(t, d, v)
		}
		if v, ok := kv["l"]; ok {
			s.LimitIOPS = num(t, d, v)
		}
		target := "vda"
		if v, ok := kv["target"]; ok {
			target = v
		}
		serial := dk // as sluice gateway disk-xml writes it
		if v, ok := kv["serial"]; ok {
			serial = v
		}
		specs = append(specs, s)
		hv.disks = append(hv.disks, &fakeDisk{vm: vm, target: target, serial: serial})
	}
	return specs
}

func render(out Output, err error, specs []entitle.DiskSpec, hv *fakeHV) string {
	var b strings.Builder
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	budget := "unlimited"
	if !math.IsInf(out.BudgetIOPS, 1) {
		budget = fmt.Sprintf("%.0f IOPS", out.BudgetIOPS)
	}
	fmt.Fprintf(&b, "host window=%.2f budget=%s latency=%s datastore=%s hosts=%d\n", out.State.Window, budget,
		ms(out.HostLatNs), ms(out.View.LatNs), out.View.Hosts)
	if c := out.State.Capacity; c.Periods() > 0 {
		if v, ok := c.Estimate(); ok {
			fmt.Fprintf(&b, "measured capacity %.0f IOPS (median of %d congested periods; datastore did %.0f)\n", v, c.Periods(), out.View.IOPS)
		} else {
			fmt.Fprintf(&b, "measured capacity: none yet (%d of %d congested periods; datastore did %.0f)\n", c.Periods(), parda.MinCapacityPeriods, out.View.IOPS)
		}
	}
	var sum float64
	for _, r := range out.Disks {
		var flags []string
		if r.New {
			flags = append(flags, "new")
		}
		if r.Reset {
			flags = append(flags, "reset")
		}
		if r.Bound {
			flags = append(flags, "bound")
		}
		dem := "inf"
		if !math.IsInf(r.DemandIOPS, 1) {
			dem = fmt.Sprintf("%.0f", r.DemandIOPS)
		}
		fmt.Fprintf(&b, "%s iops=%.0f lat=%s [%s] demand=%s ent=%.0f throttle=%d (%s)", r.Name, r.IOPS, ms(r.LatencyNs),
			strings.Join(flags, ","), dem, r.Entitlement, r.Throttle.IOPS, r.Why)
		for _, s := range specs {
			if s.Name != r.Name {
				continue
			}
			if !math.IsInf(s.LimitIOPS, 1) && (r.Throttle.IOPS == 0 || float64(r.Throttle.IOPS) > math.Ceil(s.LimitIOPS)) {
				fmt.Fprintf(&b, " <-- limit %.0f not held", s.LimitIOPS)
			}
			if r.Throttle.IOPS != 0 && float64(r.Throttle.IOPS) < s.ReservationIOPS && s.ReservationIOPS <= out.BudgetIOPS {
				fmt.Fprintf(&b, " <-- reservation %.0f not kept", s.ReservationIOPS)
			}
		}
		b.WriteString("\n")
		if r.Bound {
			sum += float64(r.Throttle.IOPS)
		}
	}
	if len(out.Gone) > 0 {
		fmt.Fprintf(&b, "gone: %s\n", strings.Join(out.Gone, " "))
	}
	if !math.IsInf(out.BudgetIOPS, 1) && sum > out.BudgetIOPS+float64(len(out.Disks)) {
		fmt.Fprintf(&b, "<-- throttles of the disks that want more add up to %.0f, above the budget\n", sum)
	}
	if len(hv.setLog) == 0 {
		b.WriteString("set: none\n")
	}
	for _, s := range hv.setLog {
		fmt.Fprintf(&b, "set: %s\n", s)
	}
	return b.String()
}

func ms(ns float64) string { return strconv.FormatFloat(ns/1e6, 'f', 2, 64) + "ms" }

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func kvs(t *testing.T, d *datadriven.TestData, f []string) map[string]string {
	m := map[string]string{}
	for _, x := range f {
		k, v, _ := strings.Cut(x, "=")
		m[k] = v
	}
	return m
}

func num(t *testing.T, d *datadriven.TestData, s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		d.Fatalf(t, "%q: not a number", s)
	}
	return v
}

func dur(t *testing.T, d *datadriven.TestData, s string) time.Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%q: not a duration", s)
	}
	return v
}
