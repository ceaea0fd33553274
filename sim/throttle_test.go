package sim

import (
	"strings"
	"testing"
)

// smallThrottle is two hosts of the throttle driver under SIOC with OLTP
// users (randomness) on a small array.
const smallThrottle = `name: small-throttle
seed: 1
duration: 30s
sample: 1s
policy:
  cluster: c
  hosts:
    - {name: h1, cpu: {cores: 4, mhz: 2800}, memory: 8GiB}
    - {name: h2, cpu: {cores: 4, mhz: 2800}, memory: 8GiB}
  datastores:
    - {name: ds1, driver: throttle, sioc: {enabled: true, congestionThreshold: 12ms}, array: {slots: 4, serviceTime: 4ms}}
  vms:
    - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1}]}
    - {name: vm2, host: h2, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, shares: high}]}
workloads:
  - {name: o1, type: oltp, disk: vm1/d0, users: 20, think: 100ms, iosPerOrder: 4, ioSize: 8KiB}
  - {name: o2, type: oltp, disk: vm2/d0, users: 20, think: 100ms, iosPerOrder: 4, ioSize: 8KiB}
`

// The throttle driver's runs are deterministic: the same scenario writes
// byte-identical summaries and series, another seed other series; and the
// driver ran (windows, budgets, throttles set) where the policy says.
func TestThrottleDeterminism(t *testing.T) {
	j1, c1, s := runOutputs(t, smallThrottle)
	j2, c2, _ := runOutputs(t, smallThrottle)
	if j1 != j2 || c1 != c2 {
		t.Fatal("same seed, different output")
	}
	if _, c3, _ := runOutputs(t, strings.Replace(smallThrottle, "seed: 1", "seed: 2", 1)); c1 == c3 {
		t.Fatal("seed 2 gave the same series as seed 1")
	}
	ds := s.dstores["ds1"]
	if ds.driver != "throttle" || len(ds.thosts) != 2 || len(ds.hosts) != 0 {
		t.Fatalf("driver %q, %d throttle hosts, %d gateway hosts", ds.driver, len(ds.thosts), len(ds.hosts))
	}
	for _, h := range ds.thosts {
		if h.st.Window <= 0 || h.last.BudgetIOPS <= 0 || h.last.View.Hosts != 2 {
			t.Errorf("%s: window %v, budget %v, hosts seen %d", h.name, h.st.Window, h.last.BudgetIOPS, h.last.View.Hosts)
		}
		for _, dk := range h.disks {
			if dk.tq.iops <= 0 || dk.ctr.Ops == 0 {
				t.Errorf("%s: throttle %v, %d ops", dk.name, dk.tq.iops, dk.ctr.Ops)
			}
		}
	}
	// Without a driver in the file the simulator runs the gateway; a
	// run's driver overrides the file's.
	_, _, g := runOutputs(t, strings.Replace(smallThrottle, "driver: throttle, ", "", 1))
	if g.dstores["ds1"].driver != "gateway" {
		t.Errorf("no driver given: %q, want gateway", g.dstores["ds1"].driver)
	}
	_, _, r := runOutputs(t, smallThrottle+"runs: [{name: gw, driver: gateway}]\n")
	if r.dstores["ds1"].driver != "gateway" {
		t.Errorf("run driver gateway: %q", r.dstores["ds1"].driver)
	}
	sc, err := ParseScenario("bad.yaml", []byte(smallThrottle+"runs: [{name: x, driver: warp}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(sc); err == nil || !strings.HasPrefix(err.Error(), "bad.yaml:18: driver: unknown driver \"warp\"") {
		t.Errorf("unknown driver: %v", err)
	}
}

// A set of a throttle disk's shares keeps its limit and reaches its
// throttle at once (the agent ends its period on a new policy).
func TestThrottleSetDisk(t *testing.T) {
	src := strings.Replace(smallThrottle, "disks: [{name: d0, datastore: ds1}]", "disks: [{name: d0, datastore: ds1, limitIOPS: 40}]", 1) +
		"timeline:\n  - {at: 10500ms, set: vm1/d0, shares: 3000}\n  - {at: 20500ms, set: vm1/d0, limit: 20}\n"
	sc, err := ParseScenario("set.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Runs[0].sim
	dk := s.disks["vm1/d0"]
	if dk.spec.Shares != 3000 || dk.spec.LimitIOPS != 20 {
		t.Errorf("spec %+v, want shares 3000, limit 20", dk.spec)
	}
	if got := dk.specAtNs(15 * Second); got.LimitIOPS != 40 || got.Shares != 3000 {
		t.Errorf("at 15 s: %+v, want limit 40, shares 3000", got)
	}
	if dk.tq.iops != 20 {
		t.Errorf("throttle %v, want 20", dk.tq.iops)
	}
	// The new limit is in force from the set on: at most the limit and
	// a bucket (a tenth of a second) in the second it was set.
	if got := dk.iops.Rate(21*Second, 30*Second); got > 20.5 {
		t.Errorf("after the set: %.1f IOPS, limit 20", got)
	}
	if got := dk.iops.Rate(11*Second, 20*Second); got > 40.5 {
		t.Errorf("before: %.1f IOPS, limit 40", got)
	}
}
