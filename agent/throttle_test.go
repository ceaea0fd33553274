package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"sluice/parda"
	"sluice/policy"
	"sluice/throttle"
)

// tuneHV is a hypervisor with one domain's disks and their throttles.
type tuneHV struct {
	tune  map[string]throttle.Limits // target → throttle
	ops   uint64
	latNs uint64 // each op's latency (0: 1 ms)
}

func (h *tuneHV) BlockStats(vms []string) ([]throttle.HostDisk, error) {
	h.ops += 100
	lat := h.latNs
	if lat == 0 {
		lat = 1e6
	}
	return []throttle.HostDisk{{VM: "vm1", Target: "vda", Serial: "d0", Counters: throttle.Counters{Ops: h.ops, Bytes: 4096 * h.ops, TimeNs: h.ops * lat}}}, nil
}
func (h *tuneHV) IOTune(vm, target string) (throttle.Limits, error) { return h.tune[target], nil }
func (h *tuneHV) SetIOTune(vm, target string, l throttle.Limits) error {
	h.tune[target] = l
	return nil
}

const throttlePolicy = `cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: ds1
    driver: throttle
vms:
  - name: vm1
    host: h1
    disks: [{name: d0, datastore: ds1, limitIOPS: 120}]
`

// The throttler sets the limit, writes its status, records the throttle
// the disk had (an operator's 500 IOPS), and an uninstall from another
// process (the files only) gives it back.
func TestThrottlerUninstall(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(throttlePolicy))
	if err != nil {
		t.Fatal(err)
	}
	state, dsDir := t.TempDir(), t.TempDir()
	hv := &tuneHV{tune: map[string]throttle.Limits{"vda": {IOPS: 500}}}
	th, err := NewThrottler(p, "h1", hv, []ThrottleDatastore{{Name: "ds1", Dir: dsDir}}, state)
	if err != nil {
		t.Fatal(err)
	}
	for now := int64(1e9); now <= 3e9; now += 1e9 {
		if _, err := th.Step(now); err != nil {
			t.Fatal(err)
		}
	}
	if hv.tune["vda"].IOPS != 120 {
		t.Fatalf("vda throttle %+v, want 120 IOPS", hv.tune["vda"])
	}
	st, err := ReadThrottleStatus(ThrottleStatusPath(state, "t", "h1"))
	if err != nil || len(st.Disks) != 1 || st.Disks[0].ThrottleIOPS != 120 || !strings.HasPrefix(st.Disks[0].Why, "limit") || st.Disks[0].Target != "vda" {
		t.Fatalf("status %+v, %v", st, err)
	}
	done, err := UninstallThrottles(hv, state, "t", "h1", nil)
	if err != nil || len(done) != 1 {
		t.Fatalf("UninstallThrottles: %q, %v", done, err)
	}
	if hv.tune["vda"].IOPS != 500 {
		t.Fatalf("after uninstall vda has %+v, want the operator's 500 IOPS back", hv.tune["vda"])
	}
	// The same throttler, run again after its uninstall, throttles again.
	hv.tune["vda"] = throttle.Limits{IOPS: 500}
	if err := th.Uninstall(); err != nil { // nothing recorded: nothing to do
		t.Fatal(err)
	}
	if _, err := th.Step(4e9); err != nil {
		t.Fatal(err)
	}
	if hv.tune["vda"].IOPS != 120 {
		t.Fatalf("run again after uninstall: vda %+v, want 120 IOPS", hv.tune["vda"])
	}
	if err := th.Uninstall(); err != nil || hv.tune["vda"].IOPS != 500 {
		t.Fatalf("second uninstall: vda %+v (%v), want 500 IOPS back", hv.tune["vda"], err)
	}
	for _, f := range []string{ThrottleStatusPath(state, "t", "h1"), ThrottleOriginalsPath(state, "t", "h1")} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall (%v)", f, err)
		}
	}
}

// manualClock is a clock whose tickers never fire: only the test moves
// a Throttler's Run on.
type manualClock struct{ now time.Time }

func (c *manualClock) Now() time.Time { return c.now }
func (c *manualClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	return make(chan time.Time), func() {}
}
func (c *manualClock) AfterFunc(time.Duration, func()) func() bool {
	return func() bool { return true }
}

// A new policy's limit reaches QEMU at once: SetPolicy ends Run's period
// without waiting for the period's tick (a ctl set is enforced within
// the agent's step, not up to a period later).
func TestThrottlerSetPolicyAtOnce(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(throttlePolicy))
	if err != nil {
		t.Fatal(err)
	}
	hv := &tuneHV{tune: map[string]throttle.Limits{}}
	th, err := NewThrottler(p, "h1", hv, []ThrottleDatastore{{Name: "ds1", Dir: t.TempDir()}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	clk := &manualClock{now: time.Unix(1000, 0)}
	steps := make(chan ThrottleStatus, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		th.Run(ctx, clk, time.Hour, func(st ThrottleStatus, err error) {
			if err != nil {
				t.Error(err)
			}
			steps <- st
		})
	}()
	defer func() { cancel(); <-done }()
	if st := <-steps; len(st.Disks) != 1 || st.Disks[0].ThrottleIOPS != 120 {
		t.Fatalf("first step: %+v, want vm1/d0 at 120 IOPS", st.Disks)
	}
	p2, err := policy.Parse("p.yaml", []byte(strings.Replace(throttlePolicy, "limitIOPS: 120", "limitIOPS: 60", 1)))
	if err != nil {
		t.Fatal(err)
	}
	clk.now = clk.now.Add(200 * time.Millisecond) // the tick is an hour away
	th.SetPolicy(p2)
	select {
	case st := <-steps:
		if len(st.Disks) != 1 || st.Disks[0].ThrottleIOPS != 60 || hv.tune["vda"].IOPS != 60 {
			t.Fatalf("after SetPolicy: %+v, QEMU %+v, want 60 IOPS", st.Disks, hv.tune["vda"])
		}
	case <-time.After(10 * time.Second): // liveness only: the step is due at once
		t.Fatal("no step within 10 s of SetPolicy: Run waits for its period's tick")
	}
}

// probeClock hands the test the probe ticker (the one of period/10) and
// every AfterFunc's delay; the period's ticker never fires.
type probeClock struct {
	manualClock
	slot   time.Duration
	ticks  chan time.Time
	delays chan time.Duration
}

func (c *probeClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	if d == c.slot {
		return c.ticks, func() {}
	}
	return make(chan time.Time), func() {}
}

func (c *probeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.delays <- d
	go f()
	return func() bool { return false }
}

type countProber struct{ n chan struct{} }

func (p countProber) Probe() (time.Duration, error) {
	p.n <- struct{}{}
	return time.Millisecond, nil
}

func (countProber) Close() error { return nil }

// Each probe falls at a random time in its tenth of the period, not at
// the tenth's start: probes that always came right after the step would
// see the datastore at the same point of what the step set off.
func TestThrottlerProbesAtRandomTimes(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(throttlePolicy))
	if err != nil {
		t.Fatal(err)
	}
	pr := countProber{n: make(chan struct{})}
	th, err := NewThrottler(p, "h1", &tuneHV{tune: map[string]throttle.Limits{}}, []ThrottleDatastore{{Name: "ds1", Dir: t.TempDir(), Probe: pr}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const period = time.Second
	clk := &probeClock{manualClock: manualClock{now: time.Unix(1000, 0)}, slot: period / ProbesPerPeriod,
		ticks: make(chan time.Time), delays: make(chan time.Duration)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		th.Run(ctx, clk, period, func(ThrottleStatus, error) {})
	}()
	defer func() { cancel(); <-done }()
	seen := map[time.Duration]bool{}
	for range 20 {
		clk.ticks <- clk.now
		var d time.Duration
		select {
		case d = <-clk.delays:
			<-pr.n
		case <-pr.n:
			t.Fatal("a probe at its slot's tick, with no wait")
		}
		if d < 0 || d >= clk.slot {
			t.Fatalf("a probe %v into its slot of %v", d, clk.slot)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 probes at %d distinct offsets in their slots, want them spread: %v", len(seen), seen)
	}
}

// A datastore whose latency stays above its congestion threshold served
// all it could: after parda.MinCapacityPeriods such periods the throttler
// has its capacity (what the host reports to the controller), and its
// status says it; before, nothing is reported.
func TestThrottlerMeasuresCapacity(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(strings.Replace(throttlePolicy, "    driver: throttle\n",
		"    driver: throttle\n    sioc: {enabled: true, congestionThreshold: 12ms}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	hv := &tuneHV{tune: map[string]throttle.Limits{}, latNs: 30e6}
	th, err := NewThrottler(p, "h1", hv, []ThrottleDatastore{{Name: "ds1", Dir: t.TempDir()}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var st ThrottleStatus
	for i := 1; i <= parda.MinCapacityPeriods+1; i++ {
		if m := th.Measured(); len(m) != 0 {
			t.Fatalf("after %d periods: measured %v, want nothing yet", i-1, m)
		}
		if st, err = th.Step(int64(i) * 1e9); err != nil {
			t.Fatal(err)
		}
	}
	// The first period has no rate yet; the next five did 100 IOPS at 30 ms.
	if m := th.Measured(); m["ds1"] != 100 || len(m) != 1 {
		t.Fatalf("measured %v, want ds1: 100", m)
	}
	if d := st.Datastores[0]; d.MeasuredIOPS != 100 || d.CapacityPeriods != parda.MinCapacityPeriods {
		t.Fatalf("status %+v, want 100 IOPS measured over %d periods", d, parda.MinCapacityPeriods)
	}
}
