package placement

import (
	"fmt"
	"testing"

	"sluice/internal/cputime"
	"sluice/policy"
)

// synthetic builds a cluster of nHosts hosts (32 cores × 2600 MHz, 1 TiB,
// two 25 GbE uplinks) and nVMs VMs placed unevenly: VM i goes to host
// (i mod nHosts) unless i is a multiple of 3, then to one of the first
// quarter of the hosts, so that a quarter of the hosts carry about twice
// the load. Every fourth VM reserves network bandwidth, every fifth CPU,
// every seventh IOPS on one of eight datastores; one VM in a hundred has
// no host (a power-on request); one in fifty is not migratable. Two hosts
// are broken: three of their VMs' vNICs reserve 13 Gbps each, more than
// the host's two uplinks may reserve (2 × 18.75 Gbps). CPU demand is given for every VM.
func synthetic(nHosts, nVMs int) (*policy.Policy, Demand) {
	p := &policy.Policy{Cluster: "bench", ReservationCap: 0.75}
	for _, name := range policy.TrafficClassNames {
		tc := policy.TrafficClass{Name: name, Shares: policy.NetSharesNormal, Limit: policy.Unlimited}
		p.TrafficClasses = append(p.TrafficClasses, tc)
	}
	for h := 0; h < nHosts; h++ {
		p.Hosts = append(p.Hosts, policy.Host{Name: fmt.Sprintf("h%04d", h),
			CPU: policy.HostCPU{Cores: 32, MHz: 2600}, Memory: 1 << 40,
			Uplinks: []policy.Uplink{{Name: "vmnic0", Speed: 25e9, Usable: 23.5e9}, {Name: "vmnic1", Speed: 25e9, Usable: 23.5e9}}})
	}
	for d := 0; d < 8; d++ {
		p.Datastores = append(p.Datastores, policy.Datastore{Name: fmt.Sprintf("ds%d", d),
			Array: policy.Array{Slots: 1 << 16, ServiceTime: 1e6}}) // 1 ms
	}
	d := Demand{CPUMHz: map[string]float64{}}
	quarter := max(nHosts/4, 1)
	for i := 0; i < nVMs; i++ {
		v := policy.VM{Name: fmt.Sprintf("vm%05d", i), Migratable: i%50 != 7,
			CPU: policy.VMCPU{VCPUs: 1 + i%4, Shares: 1000}, Memory: policy.Bytes(1+i%4) << 30}
		h := i % nHosts
		if i%3 == 0 {
			h = (i / 3) % quarter
		}
		if i%100 != 99 {
			v.Host = p.Hosts[h].Name
		}
		nic := policy.NIC{Name: "nic0", Shares: 50, Limit: policy.Unlimited}
		if i%4 == 0 {
			nic.Reservation = policy.Bps(100e6 + float64(i%3)*100e6)
		}
		v.NICs = []policy.NIC{nic}
		if i%5 == 0 {
			v.CPU.ReservationMHz = 500 + 100*(i%6)
		}
		if i%7 == 0 {
			v.Disks = []policy.Disk{{Name: "d0", Datastore: fmt.Sprintf("ds%d", i%8), ReservationIOPS: 50, LimitIOPS: policy.UnlimitedIOPS}}
		}
		p.VMs = append(p.VMs, v)
		d.CPUMHz[v.Name] = float64(300 + (i*37)%2500)
	}
	// Break two hosts: three vNICs reserve 13 Gbps each, 39 Gbps of the
	// 37.5 the host's two uplinks may reserve.
	for _, h := range []int{1, nHosts / 2} {
		n := 0
		for i := range p.VMs {
			if p.VMs[i].Host == p.Hosts[h].Name && p.VMs[i].Migratable && n < 3 {
				p.VMs[i].NICs[0].Reservation = 13e9
				n++
			}
		}
	}
	return p, d
}

// TestSyntheticPass checks a full pass on a mid-sized synthetic cluster
// from the outside: afterwards no host is broken, every power-on request
// is admitted or refused, non-migratable VMs stay, and the rebalancing
// cap holds.
func TestSyntheticPass(t *testing.T) {
	p, d := synthetic(16, 1000)
	r := Plan(p, nil, d, Options{})
	if f := Check(p, r.Placement, Options{}); len(f) > 0 {
		t.Errorf("faults after the pass: %v", f[0])
	}
	repairs, rebal, decided := 0, 0, map[string]bool{}
	for _, dc := range r.Decisions {
		switch dc.Kind {
		case Repair:
			repairs++
		case Rebalance:
			rebal++
		case Admit, Refuse:
			decided[dc.VM] = true
		case NoRepair:
			t.Errorf("no repair: %s", dc)
		}
		if dc.IsMove() && !p.VM(dc.VM).Migratable {
			t.Errorf("%s is not migratable but moved", dc.VM)
		}
	}
	for _, v := range p.VMs {
		if v.Host == "" && !decided[v.Name] {
			t.Errorf("%s: power-on request without a decision", v.Name)
		}
	}
	if repairs < 2 || rebal > 8 {
		t.Errorf("repairs %d (want ≥ 2, two hosts are broken), rebalancing moves %d (cap 8)", repairs, rebal)
	}
	if r.ImbalanceAfter > r.ImbalanceBefore {
		t.Errorf("imbalance rose: %.3f -> %.3f", r.ImbalanceBefore, r.ImbalanceAfter)
	}
	t.Logf("%d repairs, %d rebalancing moves, imbalance %.3f -> %.3f", repairs, rebal, r.ImbalanceBefore, r.ImbalanceAfter)
}

// benchPlan times full passes. Besides wall time per pass (ns/op) it
// reports the process's CPU time per pass (cpu-ms/op), which a machine
// shared with other work does not inflate.
func benchPlan(b *testing.B, nHosts, nVMs int) {
	p, d := synthetic(nHosts, nVMs)
	b.ResetTimer()
	var r Result
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		r = Plan(p, nil, d, Options{})
	}
	c1 := cputime.ProcessNs()
	b.StopTimer()
	b.ReportMetric(float64(c1-c0)/1e6/float64(b.N), "cpu-ms/op")
	moves, admits := 0, 0
	for _, dc := range r.Decisions {
		if dc.IsMove() {
			moves++
		}
		if dc.Kind == Admit || dc.Kind == Refuse {
			admits++
		}
	}
	b.ReportMetric(float64(moves), "moves")
	b.ReportMetric(float64(admits), "power-ons")
}

// BenchmarkPlan64x8000 is a full pass (repair, admission, rebalancing) on
// the vSphere 6 cluster maximum: 64 hosts, 8,000 VMs. Target ≤ 1 s.
func BenchmarkPlan64x8000(b *testing.B) { benchPlan(b, 64, 8000) }

// BenchmarkPlan1000x30000 is a full pass on 1,000 hosts and 30,000 VMs.
// Target ≤ 20 s.
func BenchmarkPlan1000x30000(b *testing.B) { benchPlan(b, 1000, 30000) }

// BenchmarkRepairStorm64x8000 is a pass in which a quarter of the hosts
// (the heavily loaded ones) lose half their memory: each needs dozens of
// migrations to be mended.
func BenchmarkRepairStorm64x8000(b *testing.B) {
	p, d := synthetic(64, 8000)
	for h := 0; h < 16; h++ {
		p.Hosts[h].Memory = 512 << 30
	}
	b.ResetTimer()
	var r Result
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		r = Plan(p, nil, d, Options{})
	}
	c1 := cputime.ProcessNs()
	b.StopTimer()
	b.ReportMetric(float64(c1-c0)/1e6/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(len(r.Moves())), "moves")
	if f := Check(p, r.Placement, Options{}); len(f) > 0 {
		b.Errorf("faults after the pass: %s", f[0])
	}
}

// BenchmarkApplyNIC1000x30000 is one change of a vNIC's reservation on
// 1,000 hosts and 30,000 VMs with every VM where the policy puts it:
// Change.Apply with its refusals (what `sluice ctl set` asks of
// placement before it reports the faults the change brings).
func BenchmarkApplyNIC1000x30000(b *testing.B) {
	p, _ := synthetic(1000, 30000)
	cur := Placement{}
	for _, v := range p.VMs {
		if v.Host != "" {
			cur[v.Name] = v.Host
		}
	}
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		c, _ := ParseChange(fmt.Sprintf("vm15000/nic0.reservation=%dMbps", 200+100*(i%2)))
		if _, _, err := c.Apply(p, cur); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/1e6/float64(b.N), "cpu-ms/op")
}

// BenchmarkCheckHosts1000x30000 is the check of the one host a vNIC
// change touches and of the cluster-wide quotas, on 1,000 hosts and
// 30,000 VMs.
func BenchmarkCheckHosts1000x30000(b *testing.B) {
	p, _ := synthetic(1000, 30000)
	cur := Placement{}
	for _, v := range p.VMs {
		if v.Host != "" {
			cur[v.Name] = v.Host
		}
	}
	hosts := []string{cur["vm15000"]}
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		CheckHosts(p, cur, Options{}, hosts)
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/1e6/float64(b.N), "cpu-ms/op")
}
