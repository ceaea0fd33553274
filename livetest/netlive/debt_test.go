package netlive

import (
	"testing"

	"sluice/agent"
	"sluice/policy"
)

const debtPolicy = `# Two VMs that reserve nothing on one 300 Mbps uplink: their classes sit
# at HTB's floor rate (30 kbit/s).
cluster: ndb
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 300Mbps}]
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, shares: normal}]}
  - {name: vm2, host: h1, nics: [{name: nic0, shares: normal}]}
`

// TestRaisedFromFloor: vm1 and vm2 send under a static tree in which
// neither reserves anything, so vm1's class (at the floor rate) runs into
// HTB token debt: one 64 KB GSO packet at 30 kbit/s owes 17 s. vm1 then
// gets a reservation of 200 Mbps (a new agent for the changed policy, as a
// policy reload does) and both send again: vm1 must get its reservation
// from the first second after the change (mean of seconds 1–4 at least
// 95% of 200 Mbps), not only what it can borrow until the debt is paid.
func TestRaisedFromFloor(t *testing.T) {
	l := upLab(t, debtPolicy)
	dev, err := l.uplinkDev("h1")
	if err != nil {
		t.Fatal(err)
	}
	ports := []string{"vm1/nic0", "vm2/nic0"}
	flows := []flow{l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1)}

	_, stop := l.runAgent(nil, "h1", false)
	for _, r := range l.runFlows(3, flows...) {
		t.Logf("before: %s per second (Mbps): %s", r.Name, r.series())
	}
	stop()
	k, err := agent.NewNetlinkKernel(l.plan.Host("h1").Name)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cs, err := k.Classes(dev)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := k.ClassTokens(dev)
	if err != nil {
		t.Fatal(err)
	}
	var debtNs int64
	for _, c := range cs {
		if c.RateBps <= 30e3 && c.Bytes > 0 {
			debtNs = min(debtNs, tokens[c.ID])
		}
	}
	t.Logf("the classes at the floor rate owe up to %.2f s of tokens", -float64(debtNs)/1e9)
	// A debt of 2 s would starve vm1 through half the seconds judged.
	if debtNs > -2e9 {
		t.Fatalf("no floor class owes 2 s of tokens after sending: nothing tested")
	}

	q := *l.p
	q.VMs = append([]policy.VM(nil), l.p.VMs...)
	q.VMs[0].NICs = append([]policy.NIC(nil), q.VMs[0].NICs...)
	q.VMs[0].NICs[0].Reservation = 200e6
	_, stop = l.runAgent(&q, "h1", false)
	defer stop()
	res := l.runFlows(5, flows...)
	for _, r := range res {
		t.Logf("after vm1 reserved 200 Mbps: %s per second (Mbps): %s", r.Name, r.series())
	}
	if got := res[0].mean(1, 5); got < 0.95*200e6 {
		t.Errorf("vm1 got %s Mbps in seconds 1–4 after its reservation of 200 Mbps: starved (token debt kept?)", mbps(got))
	}
}
