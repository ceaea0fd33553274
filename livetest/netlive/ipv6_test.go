package netlive

import (
	"math"
	"testing"

	"sluice/livetest/livelab"
)

const ipv6Policy = `# IPv6-only VMs next to IPv4 ones: a reservation and limits.
cluster: n6
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, shares: normal, reservation: 600Mbps}]}
  - {name: vm2, host: h1, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: h1, nics: [{name: nic0, shares: normal, limit: 200Mbps}]}
  - {name: vm4, host: h1, nics: [{name: nic0, shares: normal, limit: 200Mbps}]}
`

// TestIPv6Classified: VMs that send IPv6 only (vm1, vm3: no IPv4 address)
// are classified at their vNIC like IPv4 ones. vm3 (IPv6) and vm4 (IPv4),
// each limited to 200 Mbps and sending together, stay under the limit
// (mean after warm-up within 2%, as TestLimitSharesIdle) and above 90% of
// it; vm1 (IPv6, reserves 600 Mbps) and vm2 (IPv4) saturating the uplink
// get their entitlements within 5% (judged seconds, as TestFig2StepA).
func TestIPv6Classified(t *testing.T) {
	l := upLab(t, ipv6Policy)
	l.onlyIPv6("vm1/nic0")
	l.onlyIPv6("vm3/nic0")
	usable := l.measureUsable("h1", "vm1/nic0", "vm2/nic0")
	p := l.withUsable(usable)
	a, stop := l.runAgent(p, "h1", true)
	defer stop()

	lim := l.runFlows(8, l.nicFlow("vm3/nic0", 1), l.nicFlow("vm4/nic0", 1))
	for _, r := range lim {
		got := r.mean(warmupS, 0)
		t.Logf("%s limited to 200 Mbps (vm3 IPv6, vm4 IPv4): mean %s Mbps, per second %s", r.Name, mbps(got), r.series())
		if got > 200e6*1.02 || got < 200e6*0.9 {
			t.Errorf("%s: mean %s Mbps, want 180–204 under its 200 Mbps limit", r.Name, mbps(got))
		}
	}

	ports := []string{"vm1/nic0", "vm2/nic0"}
	res := l.runSaturating("h1", 12, warmupS, usable, l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1))
	want := livelab.Entitlements(p, "h1", usable, "h1/vm", ports[0], ports[1])
	for _, r := range res {
		got := r.median(warmupS)
		t.Logf("%s (%s) per second: %s; median %s Mbps, entitled %s (%+.1f%%)", r.Name, map[bool]string{true: "IPv6", false: "IPv4"}[l.ipv6[r.Name]],
			r.series(), mbps(got), mbps(want[r.Name]), 100*relErr(got, want[r.Name]))
		if e := relErr(got, want[r.Name]); math.Abs(e) > 0.05 {
			t.Errorf("%s: got %s Mbps, entitled %s: error %+.1f%% exceeds ±5%%", r.Name, mbps(got), mbps(want[r.Name]), 100*e)
		}
	}
	stop() // the agent's statistics are read once it has stopped
	for _, u := range a.Stats().Uplinks {
		for _, pt := range u.Ports {
			if pt.Class == "management" {
				t.Logf("default class %s: %d packets in the whole run", pt.Port, pt.Packets)
			}
		}
	}
}
