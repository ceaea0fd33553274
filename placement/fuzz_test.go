package placement

import (
	"strings"
	"testing"

	"sluice/policy"
)

// FuzzParseChange parses and applies arbitrary changes (the grammar of
// `sluice place --change` and `sluice ctl set`) to a small cluster: never a
// panic, errors one line, and an applied change leaves a policy whose
// limits are positive or unlimited and at least the reservations.
func FuzzParseChange(f *testing.F) {
	p, err := policy.Parse("f.yaml", []byte(`cluster: f
hosts:
  - {name: h1, cpu: {cores: 8, mhz: 2000}, memory: 64GiB, uplinks: [{name: u0, speed: 10Gbps}]}
  - {name: h2, cpu: {cores: 8, mhz: 2000}, memory: 64GiB, uplinks: [{name: u0, speed: 10Gbps}, {name: u1, speed: 1Gbps}]}
datastores: [{name: ds1}]
vms:
  - {name: vm1, host: h1, memory: 2GiB, nics: [{name: nic0, reservation: 1Gbps}], disks: [{name: d0, datastore: ds1}]}
  - {name: vm2, host: h2, nics: [{name: nic0}]}
`))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"vm1/nic0.reservation=7.5Gbps", "vm1/nic0.limit=0", "vm1/d0.limit=unlimited", "vm2.cpu.limit=800MHz",
		"h2/u1.down", "vm1.host=h2", "h1.memory=1GiB", "vm2/nic0.shares=high", "vm1/nic0.uplink=u9", "vm9=1", "=",
		"vm1/d0.\n=", // found by the fuzzer: a newline echoed unquoted
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := ParseChange(spec)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseChange(%q): error of several lines: %q", spec, err)
			}
			return
		}
		np, _, err := c.Apply(p, Placement{"vm1": "h1", "vm2": "h2"})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("Apply(%q): error of several lines: %q", spec, err)
			}
			return
		}
		for _, vm := range np.VMs {
			for _, n := range vm.NICs {
				if n.Limit <= 0 || n.Reservation > n.Limit {
					t.Fatalf("%q left %s/%s with R=%d L=%d", spec, vm.Name, n.Name, n.Reservation, n.Limit)
				}
			}
			for _, d := range vm.Disks {
				if d.LimitIOPS <= 0 || d.ReservationIOPS > d.LimitIOPS {
					t.Fatalf("%q left %s/%s with R=%d L=%d IOPS", spec, vm.Name, d.Name, d.ReservationIOPS, d.LimitIOPS)
				}
			}
		}
	})
}
