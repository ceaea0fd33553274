package placement

import (
	"strings"
	"testing"

	"sluice/policy"
)

// Every VM, vNIC and disk field of the grammar sets the policy: CPU
// shares (a keyword counts per vCPU, as in a policy file), disk shares,
// and bad values one line naming the field.
func TestChangeFields(t *testing.T) {
	p, err := policy.Parse("c.yaml", []byte(`cluster: c
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}
datastores:
  - {name: ds1}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 2}, memory: 1GiB, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	apply := func(spec string) (*policy.Policy, error) {
		t.Helper()
		ch, err := ParseChange(spec)
		if err != nil {
			return nil, err
		}
		q, _, err := ch.Apply(p, Placement{"vm1": "h1"})
		return q, err
	}
	for spec, check := range map[string]func(*policy.Policy) bool{
		"vm1.cpu.shares=high":        func(q *policy.Policy) bool { return q.VMs[0].CPU.Shares == 2*policy.CPUSharesHigh },
		"vm1.cpu.shares=1500":        func(q *policy.Policy) bool { return q.VMs[0].CPU.Shares == 1500 },
		"vm1/d0.shares=low":          func(q *policy.Policy) bool { return q.VMs[0].Disks[0].Shares == policy.StorageSharesLow },
		"vm1/nic0.shares=high":       func(q *policy.Policy) bool { return q.VMs[0].NICs[0].Shares == policy.NetSharesHigh },
		"vm1.cpu.limit=1000MHz":      func(q *policy.Policy) bool { return q.VMs[0].CPU.LimitMHz == 1000 },
		"vm1.memory=2GiB":            func(q *policy.Policy) bool { return q.VMs[0].Memory == 2<<30 },
		"vm1/d0.reservation=200":     func(q *policy.Policy) bool { return q.VMs[0].Disks[0].ReservationIOPS == 200 },
		"vm1/nic0.limit=unlimited":   func(q *policy.Policy) bool { return q.VMs[0].NICs[0].Limit == policy.Unlimited },
		"vm1.vcpus=3":                func(q *policy.Policy) bool { return q.VMs[0].CPU.VCPUs == 3 },
		"vm1/d0.limit=unlimited":     func(q *policy.Policy) bool { return q.VMs[0].Disks[0].LimitIOPS == policy.UnlimitedIOPS },
		"vm1.cpu.reservation=500MHz": func(q *policy.Policy) bool { return q.VMs[0].CPU.ReservationMHz == 500 },
	} {
		q, err := apply(spec)
		if err != nil || !check(q) {
			t.Errorf("%s: %v", spec, err)
		}
	}
	for spec, want := range map[string]string{
		"vm1.cpu.shares=lots": "cpu.shares: cannot parse \"lots\" as shares",
		"vm1/d0.shares=0":     "shares: shares must be positive",
		"vm1.cpu.bogus=1":     "unknown VM field \"cpu.bogus\" (host, memory, vcpus, cpu.reservation, cpu.shares, cpu.limit, migratable)",
	} {
		if _, err := apply(spec); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", spec, err, want)
		}
	}
}
