package sim

import (
	"testing"
)

const liveScenario = `name: live-rows
seed: 1
duration: 1s
sample: 500ms
calibration: "a test"
policy:
  cluster: t
  hosts:
    - {name: h1, cpu: {cores: 8, mhz: 2800}, memory: 64GiB, uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]}
  vms:
    - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 2GiB, nics: [{name: nic0}]}
workloads:
  - {name: vm1, type: bulk, port: vm1/nic0, streams: 1}
expect:
  - {name: sim row, metric: rate, of: vm1/nic0, op: ">=", value: 1Gbps}
  - {name: cpu, kind: live, live: "bench", op: "<=", value: 1.05, better: lower}
  - {name: lat, kind: live, live: "bench", unit: us, op: "<=", value: 5}
`

// TestLiveRows: kind: live expectations are pending (neither met nor
// missed) without live figures, and judged on them when given.
func TestLiveRows(t *testing.T) {
	run := func(lf *LiveFigures) []Outcome {
		sc, err := ParseScenario("live.yaml", []byte(liveScenario))
		if err != nil {
			t.Fatal(err)
		}
		sc.Live = lf
		res, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Summary.Expect[0]; got.Source != "sim" || got.How != "a test" || !got.Pass {
			t.Errorf("sim row: %+v", got)
		}
		return res.Summary.Expect
	}
	for _, o := range run(nil)[1:] {
		if !o.Pending || o.Pass || o.Source != "live" {
			t.Errorf("without live figures: %+v, want pending", o)
		}
	}
	got := run(&LiveFigures{Source: "here", Figures: map[string]LiveFigure{
		"cpu": {Value: 1.03, Unit: "ratio"},
		"lat": {Value: 7, Unit: "us"},
	}})
	if o := got[1]; o.Pending || !o.Pass || o.Verdict != "beats the seed" || o.How != "bench; here" {
		t.Errorf("cpu 1.03 ≤ 1.05: %+v", o)
	}
	if o := got[2]; o.Pending || o.Pass {
		t.Errorf("lat 7 µs ≤ 5 µs: %+v, want not met", o)
	}
	if o := run(&LiveFigures{Figures: map[string]LiveFigure{"lat": {Value: 3, Unit: "ms"}}})[2]; o.Error == "" {
		t.Errorf("a live figure in another unit: %+v, want an error", o)
	}
}
