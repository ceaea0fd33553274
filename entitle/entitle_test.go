package entitle

import (
	"fmt"
	"strings"
	"testing"

	"sluice/alloc"
	"sluice/internal/cputime"
	"sluice/policy"
)

// bigPolicy is one host, one 10 GbE uplink, the DESIGN.md §4 classes and
// n VMs with one vNIC each (one in ten reserving 5 Mbps).
func bigPolicy(t testing.TB, n int) *policy.Policy {
	var b strings.Builder
	b.WriteString(`cluster: big
hosts:
  - {name: h1, cpu: {cores: 4096, mhz: 2800}, memory: 65536GiB, uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]}
trafficClasses:
  vm:      {shares: high, reservation: 4.8Gbps}
  nfs:     {shares: normal}
  vmotion: {shares: normal, limit: 4Gbps}
vms:
`)
	for i := 0; i < n; i++ {
		res := ""
		if i%10 == 0 {
			res = ", reservation: 5Mbps"
		}
		fmt.Fprintf(&b, "  - {name: vm%d, host: h1, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, portGroup: pg, shares: normal%s}]}\n", i, res)
	}
	p, err := policy.Parse("big.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNetRecomputeZeroAllocs asserts that changing demands and recomputing
// a built Net allocates nothing (the agent and the simulator do this on
// every tick), and that the result still satisfies alloc.Check.
func TestNetRecomputeZeroAllocs(t *testing.T) {
	p := bigPolicy(t, 200)
	n, err := Network(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	ports := n.Port("vm7/nic0")
	i := 0
	allocs := testing.AllocsPerRun(50, func() {
		i++
		ports[0].Node.Demand = float64(i%5) * 1e8
		n.Compute()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Compute, want 0", allocs)
	}
	for _, u := range n.Uplinks {
		if v := alloc.Check(u.Root, u.CapacityBps, 1e-9*u.CapacityBps); len(v) > 0 {
			t.Error(v)
		}
	}
}

// BenchmarkNetCompute recomputes one uplink with 1,000 vNICs and three
// classes built from a policy.
func BenchmarkNetCompute(b *testing.B) {
	p := bigPolicy(b, 1000)
	n, err := Network(p, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := cputime.ProcessNs()
	for b.Loop() {
		n.Compute()
	}
	cpu := cputime.ProcessNs() - cpu0
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op") // wall ns/op overstates on a loaded machine
}
