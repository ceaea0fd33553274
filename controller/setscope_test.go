package controller

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"sluice/entitle"
	"sluice/placement"
	"sluice/policy"
)

// setCluster is a random cluster for the shortcuts of view.set: hosts
// with CPU, memory and one to three uplinks, a vm class reservation or
// none, network pools, datastores, VMs with reserving, pinned and
// passthrough vNICs and IOPS reservations, and where the VMs hold their
// reservations (some off, some on a host the policy lacks). A VM may be
// named like a host.
func setCluster(seed uint64) (*policy.Policy, placement.Placement) {
	rng := rand.New(rand.NewPCG(seed, 61))
	p := &policy.Policy{Cluster: "rnd", ReservationCap: 0.75}
	for _, n := range policy.TrafficClassNames {
		tc := policy.TrafficClass{Name: n, Shares: 50, Limit: policy.Unlimited, Declared: rng.IntN(2) == 0}
		if n == "vm" && rng.IntN(3) == 0 {
			tc.Reservation = policy.Bps(3+rng.IntN(4)) * 1e9
		}
		p.TrafficClasses = append(p.TrafficClasses, tc)
	}
	nh := 2 + rng.IntN(4)
	for h := 0; h < nh; h++ {
		host := policy.Host{Name: fmt.Sprintf("h%d", h), CPU: policy.HostCPU{Cores: 4 + 4*rng.IntN(4), MHz: 2000},
			Memory: policy.Bytes(16+16*rng.IntN(4)) << 30}
		for u := 0; u < 1+rng.IntN(3); u++ {
			host.Uplinks = append(host.Uplinks, policy.Uplink{Name: fmt.Sprintf("u%d", u), Speed: 10e9, Usable: 9.4e9})
		}
		p.Hosts = append(p.Hosts, host)
	}
	for k := 0; k < rng.IntN(3); k++ {
		p.NetworkPools = append(p.NetworkPools, policy.NetworkPool{Name: fmt.Sprintf("pool%d", k),
			Reservation: policy.Bps(1+rng.IntN(20)) * 1e9, PortGroups: []string{fmt.Sprintf("pg%d", k)}})
	}
	for d := 0; d < rng.IntN(3); d++ {
		ds := policy.Datastore{Name: fmt.Sprintf("ds%d", d)}
		if rng.IntN(2) == 0 {
			ds.Array = policy.Array{Slots: 1 + rng.IntN(3), ServiceTime: time.Millisecond}
		}
		p.Datastores = append(p.Datastores, ds)
	}
	hold := placement.Placement{}
	for i := 0; i < 2+rng.IntN(5*nh); i++ {
		v := policy.VM{Name: fmt.Sprintf("v%d", i), Migratable: true, CPU: policy.VMCPU{VCPUs: 1 + rng.IntN(4), ReservationMHz: 500 * rng.IntN(6)},
			Memory: policy.Bytes(1+rng.IntN(8)) << 30}
		if i == 0 && rng.IntN(4) == 0 {
			v.Name = "h0" // a VM named like a host
		}
		for k := 0; k < rng.IntN(4); k++ {
			n := policy.NIC{Name: fmt.Sprintf("nic%d", k), Shares: 50, Limit: policy.Unlimited,
				Reservation: []policy.Bps{0, 5e8, 1e9, 2e9, 3e9, 5e9}[rng.IntN(6)]}
			switch rng.IntN(8) {
			case 0:
				n.Uplink = fmt.Sprintf("u%d", rng.IntN(3))
			case 1:
				n.PortGroup = fmt.Sprintf("pg%d", rng.IntN(3))
			case 2:
				n.Passthrough, n.Reservation = true, 0
			}
			v.NICs = append(v.NICs, n)
		}
		for k := 0; k < rng.IntN(3); k++ {
			v.Disks = append(v.Disks, policy.Disk{Name: fmt.Sprintf("d%d", k), Datastore: fmt.Sprintf("ds%d", rng.IntN(3)),
				Shares: 1000, ReservationIOPS: policy.IOPS(200 * rng.IntN(8)), LimitIOPS: policy.UnlimitedIOPS})
		}
		switch rng.IntN(8) {
		case 0: // off
		case 1:
			hold[v.Name] = "gone"
		default:
			hold[v.Name] = p.Hosts[rng.IntN(nh)].Name
		}
		p.VMs = append(p.VMs, v)
	}
	return p, hold
}

// setChange is a random change that set accepts the grammar of.
func setChange(rng *rand.Rand, p *policy.Policy) string {
	v := &p.VMs[rng.IntN(len(p.VMs))]
	h := &p.Hosts[rng.IntN(len(p.Hosts))]
	nic, disk := "nic0", "d0"
	if len(v.NICs) > 0 {
		nic = v.NICs[rng.IntN(len(v.NICs))].Name
	}
	if len(v.Disks) > 0 {
		disk = v.Disks[rng.IntN(len(v.Disks))].Name
	}
	switch rng.IntN(10) {
	case 0, 1, 2:
		return fmt.Sprintf("%s/%s.reservation=%s", v.Name, nic, []string{"0", "1Gbps", "2Gbps", "4Gbps", "6Gbps", "9Gbps"}[rng.IntN(6)])
	case 3:
		return fmt.Sprintf("%s/%s.uplink=%s", v.Name, nic, []string{"", "u0", "u1", "u2"}[rng.IntN(4)])
	case 4:
		return fmt.Sprintf("%s/%s.shares=%s", v.Name, nic, []string{"low", "high", "80"}[rng.IntN(3)])
	case 5:
		return fmt.Sprintf("%s/%s.reservation=%d", v.Name, disk, 300*rng.IntN(10))
	case 6:
		return fmt.Sprintf("%s.cpu.reservation=%dMHz", v.Name, 2000*rng.IntN(10))
	case 7:
		return fmt.Sprintf("%s.memory=%dGiB", v.Name, 1+rng.IntN(40))
	case 8:
		if len(h.Uplinks) > 0 {
			return fmt.Sprintf("%s/%s.down", h.Name, h.Uplinks[rng.IntN(len(h.Uplinks))].Name)
		}
	}
	return fmt.Sprintf("%s.%s", h.Name, []string{"memory=8GiB", "cores=2", "mhz=1000"}[rng.IntN(3)])
}

// TestSetShortcutsAgree checks, on 3,000 random clusters with one to
// three changes each (made as view.set makes them), that the faults the
// changes bring, checked on the hosts they touch (faultEventsOn), are the
// events of whole-cluster Checks (faultEvents), and that each change's
// outcome, from the trees of its port's host, is what the trees of the
// whole cluster give (outcomeWhole).
func TestSetShortcutsAgree(t *testing.T) {
	var events, outcomes int
	for seed := uint64(1); seed <= 3000; seed++ {
		p0, hold := setCluster(seed)
		rng := rand.New(rand.NewPCG(seed, 67))
		p := p0
		touched := []string{}
		var chs []placement.Change
		for k := 0; k < 1+rng.IntN(3); k++ {
			ch, err := placement.ParseChange(setChange(rng, p))
			if err != nil {
				t.Fatal(err)
			}
			touched = append(touched, ch.Hosts(p, hold)...)
			np, err := ch.Policy(p, hold)
			if err != nil {
				continue // refused: set would stop here
			}
			p = np
			chs = append(chs, ch)
		}
		want := faultEvents(p0, hold, p, hold)
		got := faultEventsOn(touched, p0, hold, p, hold)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: changes %v on hosts %v:\nfaultEventsOn %v\nfaultEvents   %v", seed, specs(chs), touched, got, want)
		}
		events += len(want)
		for _, ch := range chs {
			if g, w := outcome(p, hold, ch), outcomeWhole(p, hold, ch); g != w {
				t.Fatalf("seed %d: %s: outcome %q, whole %q", seed, ch.Spec, g, w)
			}
			if outcome(p, hold, ch) != "" {
				outcomes++
			}
		}
	}
	t.Logf("compared %d fault events, %d outcomes", events, outcomes)
	if events == 0 || outcomes == 0 {
		t.Error("the draws never brought a fault or an outcome")
	}
}

// outcomeWhole is outcome from the trees of the whole cluster.
func outcomeWhole(p *policy.Policy, place placement.Placement, ch placement.Change) string {
	if ch.Sub == "" {
		return ""
	}
	n := entitle.NewNet(entitle.Derive(p, entitle.Live{Hosts: place}))
	n.Compute()
	ports := n.Port(subjectOf(ch))
	if len(ports) == 0 {
		return ""
	}
	pt := ports[0]
	return fmt.Sprintf(": %s gets %s on %s/%s", pt.Name, entitle.FormatBps(pt.AllocBps()), pt.Host, pt.Uplink)
}
