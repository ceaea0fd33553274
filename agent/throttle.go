package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"sluice/entitle"
	"sluice/internal/clock"
	"sluice/policy"
	"sluice/throttle"
	"sluice/throttle/dirstats"
)

// ThrottleDatastore is a datastore of the host under the throttle driver:
// its name in the policy and its directory on this host (where the
// datastore's shared stats live).
type ThrottleDatastore struct {
	Name string
	Dir  string
	// Probe measures the datastore's latency below QEMU's throttles
	// (ProbesPerPeriod reads a period); nil: none, the driver then takes
	// the latency of the disks their throttle did not hold.
	Probe Prober
}

// ProbesPerPeriod is how many probe reads a host makes of each datastore
// in a control period, one at a time.
const ProbesPerPeriod = 10

// Throttler runs the throttle driver (package throttle) for the host's
// datastores every period: QEMU's throttle per disk from reservations,
// shares, limits and the host's PARDA budget. It records the throttle each
// disk had before sluice set one (ThrottleOriginalsPath), so that
// Uninstall, and `sluice agent uninstall` after a crash, give it back.
type Throttler struct {
	Cluster, Host string
	StateDir      string
	// Domain names the libvirt domain of a policy VM; nil: the VM's name.
	// Set it before the first Step.
	Domain func(vm string) string

	mu      sync.Mutex
	p       *policy.Policy
	hv      throttle.Hypervisor
	dss     []ThrottleDatastore
	drivers map[string]*throttle.Driver
	probes  map[string]*probes
	lastNs  int64
	// kick asks Run for a period at once: a new policy's limits reach
	// QEMU without waiting for the period to end.
	kick chan struct{}
}

// NewThrottler returns the throttler of host's datastores dss in policy
// p, setting throttles through hv. It takes over the originals an earlier
// agent recorded in stateDir.
func NewThrottler(p *policy.Policy, host string, hv throttle.Hypervisor, dss []ThrottleDatastore, stateDir string) (*Throttler, error) {
	t := &Throttler{Cluster: p.Cluster, Host: host, StateDir: stateDir, hv: hv, dss: dss, drivers: map[string]*throttle.Driver{}, probes: map[string]*probes{},
		kick: make(chan struct{}, 1)}
	orig, err := readOriginals[map[string]throttle.Limits](ThrottleOriginalsPath(stateDir, p.Cluster, host))
	if err != nil {
		return nil, err
	}
	for _, ds := range dss {
		if p.Datastore(ds.Name) == nil {
			return nil, fmt.Errorf("throttle driver: datastore %s is not in the policy", ds.Name)
		}
		d := &throttle.Driver{Host: host, Datastore: ds.Name, HV: hv, Stats: dirstats.Dir{Path: ds.Dir, Host: host}}
		d.SetOriginals(orig[ds.Name])
		t.drivers[ds.Name] = d
		if ds.Probe != nil {
			t.probes[ds.Name] = &probes{}
		}
	}
	t.SetPolicy(p)
	return t, nil
}

// SetPolicy takes a new policy (reservations, shares, limits, placement
// and SIOC settings); Run ends the period at once, so that the new
// throttles are set now rather than up to a period later.
func (t *Throttler) SetPolicy(p *policy.Policy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.p = p
	for _, ds := range t.dss {
		d := t.drivers[ds.Name]
		d.Ctl = nil
		if pd := p.Datastore(ds.Name); pd != nil && pd.SIOC.Enabled {
			d.Ctl = pd.SIOC.Controller()
		}
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// hostDisks are the disks of the host's VMs on datastore ds in p.
func hostDisks(p *policy.Policy, host, ds string) []entitle.DiskSpec {
	var out []entitle.DiskSpec
	spec := entitle.Derive(p, entitle.Live{}).Datastore(ds)
	if spec == nil {
		return nil
	}
	for _, d := range spec.Disks {
		if d.Host == host {
			out = append(out, d)
		}
	}
	return out
}

// Step runs one period of every datastore ending at nowNs, writes the
// status and the originals files, and returns the status.
func (t *Throttler) Step(nowNs int64) (ThrottleStatus, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	periodNs := nowNs - t.lastNs
	if t.lastNs == 0 || periodNs <= 0 {
		periodNs = int64(time.Second)
	}
	t.lastNs = nowNs
	st := ThrottleStatus{Cluster: t.Cluster, Host: t.Host, TimeUnixNs: nowNs, PeriodS: float64(periodNs) / 1e9}
	var errs []error
	orig := map[string]map[string]throttle.Limits{}
	for _, ds := range t.dss {
		d := t.drivers[ds.Name]
		d.Domain = t.Domain
		specs := hostDisks(t.p, t.Host, ds.Name)
		probe, perr := t.takeProbe(ds.Name)
		if perr != nil {
			errs = append(errs, fmt.Errorf("datastore %s: %w", ds.Name, perr))
		}
		out, err := d.Period(specs, nowNs, periodNs, probe)
		dst := ThrottleDatastoreStatus{Name: ds.Name, Dir: ds.Dir, SIOC: d.Ctl != nil, Window: out.State.Window,
			BudgetIOPS: finite(out.BudgetIOPS), HostLatencyMs: out.HostLatNs / 1e6, DatastoreLatencyMs: out.View.LatNs / 1e6, HostsSeen: out.View.Hosts}
		if probe != nil {
			dst.Probes = probe.N
		}
		c := out.State.Capacity
		dst.CapacityPeriods = c.Periods()
		if v, ok := c.Estimate(); ok {
			dst.MeasuredIOPS = v
		}
		if d.Ctl != nil {
			dst.ThresholdMs = d.Ctl.Config().ThresholdNs / 1e6
		}
		if err != nil {
			errs = append(errs, err)
			dst.Error = err.Error()
		}
		st.Datastores = append(st.Datastores, dst)
		for _, r := range out.Disks {
			s := r.Spec
			vm, target, _ := d.Location(r.Name)
			st.Disks = append(st.Disks, ThrottleDiskStatus{Disk: r.Name, Datastore: ds.Name, VM: vm, Target: target,
				ReservationIOPS: s.ReservationIOPS, Shares: s.Shares, LimitIOPS: finite(s.LimitIOPS),
				IOPS: r.IOPS, MBps: r.Bytes / 1e6, LatencyMs: r.LatencyNs / 1e6, Bound: r.Bound,
				DemandIOPS: finite(r.DemandIOPS), EntitlementIOPS: finite(r.Entitlement), ThrottleIOPS: r.Throttle.IOPS, Why: r.Why})
		}
		orig[ds.Name] = d.Originals()
	}
	if err := writeJSON(ThrottleOriginalsPath(t.StateDir, t.Cluster, t.Host), orig); err != nil {
		errs = append(errs, fmt.Errorf("throttle originals: %w", err))
	}
	if err := writeJSON(ThrottleStatusPath(t.StateDir, t.Cluster, t.Host), st); err != nil {
		errs = append(errs, fmt.Errorf("throttle status: %w", err))
	}
	return st, errors.Join(errs...)
}

// Measured returns the capacities of the datastores that the driver
// measured so far (parda.Capacity), in whole IOPS: what the host reports
// to the controller for admission.
func (t *Throttler) Measured() map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]float64{}
	for name, d := range t.drivers {
		if v, ok := d.Last().State.Capacity.Estimate(); ok && v >= 1 {
			out[name] = math.Floor(v)
		}
	}
	return out
}

// takeProbe returns the probes of datastore ds since the last period
// (nil without a prober); a failed probe is an error of the period.
func (t *Throttler) takeProbe(ds string) (*throttle.Probe, error) {
	ps := t.probes[ds]
	if ps == nil {
		return nil, nil
	}
	p, err := ps.take()
	return &p, err
}

// Run steps every period until ctx ends, reporting each step, and probes
// each datastore with a prober ProbesPerPeriod times a period.
func (t *Throttler) Run(ctx context.Context, clk clock.Clock, period time.Duration, report func(ThrottleStatus, error)) {
	c := clock.Or(clk)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, ds := range t.dss {
		if ds.Probe == nil {
			continue
		}
		ps := t.probes[ds.Name]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One probe in each tenth of the period, at a random time
			// in it: probes at fixed times after the step's would
			// always fall at the same point of what the step set off
			// (QEMU lets a disk whose throttle was just set pass a
			// tenth of a second's I/O at once).
			slot := period / ProbesPerPeriod
			ticks, stop := c.NewTicker(slot)
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-ticks:
				}
				if d := time.Duration(rand.Int64N(int64(slot))); d > 0 {
					at := make(chan struct{})
					cancel := c.AfterFunc(d, func() { close(at) })
					select {
					case <-ctx.Done():
						cancel()
						return
					case <-at:
					}
				}
				ps.add(ds.Probe.Probe())
			}
		}()
	}
	select {
	case <-t.kick: // the policy NewThrottler took: the first step has it
	default:
	}
	report(t.Step(c.Now().UnixNano()))
	ticks, stop := c.NewTicker(period)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticks:
			report(t.Step(now.UnixNano()))
		case <-t.kick:
			// A new policy: a period that ends now (Step measures over
			// the time since the last one, however short).
			report(t.Step(c.Now().UnixNano()))
		}
	}
}

// Uninstall gives every disk the throttle it had before sluice set one
// and removes the throttler's files; the throttler may Run again.
func (t *Throttler) Uninstall() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := UninstallThrottles(t.hv, t.StateDir, t.Cluster, t.Host, t.Domain)
	for _, d := range t.drivers {
		d.Reset() // a later Run starts afresh: reads the originals, sets every throttle
	}
	t.lastNs = 0
	return err
}

// UninstallThrottles gives every disk that the throttle driver of host
// set a throttle on the throttle it had before (recorded in stateDir), on
// the domains that run now (domain names a VM's, nil: the VM's name), and
// removes the driver's files there. A
// domain that stopped took sluice's throttle with it (QEMU keeps it in
// the process; the domain's definition was never changed).
// It returns a line per disk given back.
func UninstallThrottles(hv throttle.Hypervisor, stateDir, cluster, host string, domain func(vm string) string) ([]string, error) {
	path := ThrottleOriginalsPath(stateDir, cluster, host)
	orig, err := readOriginals[map[string]throttle.Limits](path)
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	left := map[string]map[string]throttle.Limits{}
	for ds, m := range orig {
		d := &throttle.Driver{Host: host, Datastore: ds, HV: hv, Domain: domain}
		d.SetOriginals(m)
		var vms []string
		for name := range m {
			vm, _, _ := strings.Cut(name, "/")
			vms = append(vms, vm)
		}
		if err := d.Restore(vms); err != nil {
			errs = append(errs, err)
		}
		rest := d.Originals()
		for name, l := range m {
			if _, ok := rest[name]; !ok {
				done = append(done, fmt.Sprintf("disk %s: throttle set by sluice removed (given back: %d IOPS, 0 = none)", name, l.IOPS))
			}
		}
		if len(rest) > 0 {
			left[ds] = rest
		}
	}
	if len(left) > 0 {
		if err := writeJSON(path, left); err != nil {
			errs = append(errs, err)
		}
	} else if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := os.Remove(ThrottleStatusPath(stateDir, cluster, host)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	slices.Sort(done)
	return done, errors.Join(errs...)
}

// ThrottleStatus is what the throttle driver of a host did in its last
// period (the file ThrottleStatusPath; `sluice explain VM/DISK` reads it).
type ThrottleStatus struct {
	Cluster    string                    `json:"cluster"`
	Host       string                    `json:"host"`
	TimeUnixNs int64                     `json:"time_unix_ns"`
	PeriodS    float64                   `json:"period_s"`
	Datastores []ThrottleDatastoreStatus `json:"datastores"`
	Disks      []ThrottleDiskStatus      `json:"disks"`
}

// ThrottleDatastoreStatus is the host's budget on one datastore.
// BudgetIOPS is -1 when unbounded (no SIOC).
type ThrottleDatastoreStatus struct {
	Name               string  `json:"name"`
	Dir                string  `json:"dir"`
	SIOC               bool    `json:"sioc"`
	Window             float64 `json:"window"`
	BudgetIOPS         float64 `json:"budget_iops"`
	HostLatencyMs      float64 `json:"host_latency_ms"`
	DatastoreLatencyMs float64 `json:"datastore_latency_ms"`
	ThresholdMs        float64 `json:"threshold_ms"`
	HostsSeen          int     `json:"hosts_seen"`
	Probes             int     `json:"probes"` // probe reads in the period (their latency is the host's)
	// MeasuredIOPS is the datastore's capacity as measured in the periods
	// it was congested in (parda.Capacity; 0: fewer than
	// parda.MinCapacityPeriods of them yet, CapacityPeriods so far).
	MeasuredIOPS    float64 `json:"measured_iops"`
	CapacityPeriods int     `json:"capacity_periods"`
	Error           string  `json:"error,omitempty"`
}

// ThrottleDiskStatus is one disk's period: what it did and the throttle
// it gets, and why. -1 is unlimited or unbounded.
type ThrottleDiskStatus struct {
	Disk            string  `json:"disk"`
	Datastore       string  `json:"datastore"`
	VM              string  `json:"vm"`
	Target          string  `json:"target"`
	ReservationIOPS float64 `json:"reservation_iops"`
	Shares          float64 `json:"shares"`
	LimitIOPS       float64 `json:"limit_iops"`
	IOPS            float64 `json:"iops"`
	MBps            float64 `json:"mbps"`
	LatencyMs       float64 `json:"latency_ms"`
	Bound           bool    `json:"bound"`
	DemandIOPS      float64 `json:"demand_iops"`
	EntitlementIOPS float64 `json:"entitlement_iops"`
	ThrottleIOPS    int64   `json:"throttle_iops"` // 0: none
	Why             string  `json:"why"`
}

func finite(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return -1
	}
	return v
}

// ThrottleStatusPath is the throttle driver's status file of a host.
func ThrottleStatusPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("throttle-%s-%s.json", cluster, host))
}

// ThrottleOriginalsPath is where a host's agent records the throttles the
// disks had before sluice set theirs.
func ThrottleOriginalsPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("throttle-originals-%s-%s.json", cluster, host))
}

// ReadThrottleStatus reads a status file.
func ReadThrottleStatus(path string) (ThrottleStatus, error) {
	var s ThrottleStatus
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// readOriginals reads an originals file (the throttles, pinnings or VF
// rates sluice found before it set its own), a JSON object; a missing
// file, or no path, is empty.
func readOriginals[V any](path string) (map[string]V, error) {
	m := map[string]V{}
	if path == "" {
		return m, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
