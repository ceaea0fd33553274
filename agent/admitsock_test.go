package agent

import (
	"context"
	"strings"
	"testing"

	"sluice/admit"
	"sluice/policy"
)

// A datastore whose policy declares no capacity is bounded, when the
// host decides a start itself, by the capacity its throttle driver
// measured (Admitter.SetMeasured): vm2's 300 IOPS fit beside vm1's 300
// until the datastore is measured at 500.
func TestAdmitterMeasuredCapacity(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: nfs1
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: nfs1, reservationIOPS: 300}]}
  - {name: vm2, host: h1, disks: [{name: d0, datastore: nfs1, reservationIOPS: 300}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := &Admitter{Host: "h1", Running: func() ([]admit.Domain, error) { return []admit.Domain{{Name: "vm1"}}, nil }}
	a.Set(p, nil)
	d, err := a.Decide(context.Background(), admit.Domain{Name: "vm2"})
	if err != nil || !d.Allow {
		t.Fatalf("not measured: %+v, %v; want vm2 allowed", d, err)
	}
	a.SetMeasured(func() map[string]float64 { return map[string]float64{"nfs1": 500} })
	d, err = a.Decide(context.Background(), admit.Domain{Name: "vm2"})
	if err != nil || d.Allow || !strings.Contains(d.String(), "datastore nfs1") || !strings.Contains(d.String(), "measured") {
		t.Fatalf("measured at 500 IOPS: %+v (%s), %v; want vm2 refused, naming the datastore's measured capacity", d, d.String(), err)
	}
	t.Log(d.String())
}
