package agent

import (
	"os"
	"strings"
	"testing"

	"sluice/policy"
	"sluice/throttle"
)

// tuneHV is a hypervisor with one domain's disks and their throttles.
type tuneHV struct {
	tune map[string]throttle.Limits // target → throttle
	ops  uint64
}

func (h *tuneHV) BlockStats(vms []string) ([]throttle.HostDisk, error) {
	h.ops += 100
	return []throttle.HostDisk{{VM: "vm1", Target: "vda", Serial: "d0", Counters: throttle.Counters{Ops: h.ops, Bytes: 4096 * h.ops, TimeNs: h.ops * 1e6}}}, nil
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
