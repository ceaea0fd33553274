package admit

import (
	"strings"
	"testing"

	"sluice/policy"
)

const testPolicy = `cluster: c
reservationCap: 0.75
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, cpu: {cores: 4, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}
datastores: [{name: ds1, array: {slots: 1, serviceTime: 1ms}}]
vms:
  - {name: big, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 600Mbps}]}
  - {name: mid, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 200Mbps}]}
  - {name: small, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 100Mbps}]}
  - {name: cpuhog, cpu: {vcpus: 2, reservationMHz: 7000}, memory: 1GiB, nics: [{name: nic0}]}
  - {name: cpuhog2, cpu: {vcpus: 1, reservationMHz: 2000}, memory: 1GiB}
  - {name: memhog, cpu: {vcpus: 1}, memory: 7GiB, nics: [{name: nic0}]}
  - {name: ioheavy, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, reservationIOPS: 700}]}
  - {name: iolight, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, reservationIOPS: 300}]}
  - {name: 6f1c2a3b-0000-4000-8000-00000000abcd, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 50Mbps}]}
`

func TestDecide(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	doms := func(names ...string) []Domain {
		var ds []Domain
		for _, n := range names {
			ds = append(ds, Domain{Name: n})
		}
		return ds
	}
	for _, c := range []struct {
		name    string
		host    string
		dom     Domain
		running []Domain
		allow   bool
		want    string // in the printed decision
	}{
		{"alone fits", "h1", Domain{Name: "big"}, nil, true, "fit on h1 with the 0 VMs"},
		{"network: 600+200 > 750 budget", "h1", Domain{Name: "mid"}, doms("big"), false,
			"network: needs 200Mbps of vNIC reservations, free 150Mbps (short 50Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)])"},
		{"unnamed running domains reserve nothing", "h1", Domain{Name: "mid"}, doms("stranger", "other"), true, "admitted mid"},
		{"itself among the running is not counted twice", "h1", Domain{Name: "big"}, doms("big"), true, "admitted big"},
		{"a VM of another host runs here: it counts here", "h1", Domain{Name: "big"}, doms("small", "mid"), false, "short 150Mbps"},
		{"placement's host is not asked: a VM may start on any host", "h2", Domain{Name: "mid"}, doms("small"), true, "fit on h2 with the 1 VMs"},
		{"cpu", "h1", Domain{Name: "cpuhog"}, nil, true, "admitted"},
		{"cpu short", "h1", Domain{Name: "cpuhog"}, doms("cpuhog2"), false, "cpu: needs 7000MHz reserved, free 6000MHz"},
		{"memory short", "h1", Domain{Name: "memhog"}, doms("big", "mid"), false, "memory: needs 7GiB, free 6GiB"},
		{"iops: the policy refuses an over-committed datastore, so its VMs always fit", "h1", Domain{Name: "ioheavy"}, doms("iolight"), true, "admitted ioheavy"},
		{"by UUID", "h1", Domain{Name: "web7", UUID: "6F1C2A3B-0000-4000-8000-00000000ABCD"}, doms("big"), true, "admitted 6f1c2a3b-0000-4000-8000-00000000abcd"},
		{"running named by UUID", "h1", Domain{Name: "mid"}, []Domain{{Name: "x", UUID: "6f1c2a3b-0000-4000-8000-00000000abcd"}, {Name: "big"}}, false, "short 100Mbps"},
		{"not in the policy", "h1", Domain{Name: "stranger"}, doms("big"), true, "not named by the policy"},
		{"host not in the policy", "h9", Domain{Name: "big"}, nil, true, "not in the policy"},
	} {
		d := Decide(p, c.host, c.dom, c.running)
		if d.Allow != c.allow || !strings.Contains(d.String(), c.want) {
			t.Errorf("%s: %v, want allow=%v and %q", c.name, d, c.allow, c.want)
		}
		if strings.Contains(d.String(), "\n") {
			t.Errorf("%s: decision is not one line: %q", c.name, d)
		}
	}
}

// TestDecideUnnamed: with an unnamedVMs reservation, a domain the policy
// does not name reserves it on each of its vNICs, running or starting.
func TestDecideUnnamed(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(testPolicy+"unnamedVMs: {reservation: 100Mbps}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		dom     Domain
		running []Domain
		allow   bool
		want    string
	}{
		{"running unnamed domains reserve 100Mbps per vNIC: 600+2×100 > 750", Domain{Name: "big"}, []Domain{{Name: "stranger", VNICs: 2}}, false,
			"network: needs 600Mbps of vNIC reservations, free 550Mbps (short 50Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)])"},
		{"one vNIC fits", Domain{Name: "big"}, []Domain{{Name: "stranger", VNICs: 1}}, true, "admitted big"},
		{"an unnamed domain starting is checked", Domain{Name: "web7", VNICs: 2}, []Domain{{Name: "big"}}, false,
			"refused web7: its reservations (unnamedVMs: 100Mbps per vNIC, 2 vNICs) do not fit on h1 with the 1 VMs that run there: network: needs 200Mbps of vNIC reservations, free 150Mbps (short 50Mbps; vm budget of uplink [up0 750Mbps (reservationCap 0.75 × 1Gbps)])"},
		{"an unnamed domain that fits starts", Domain{Name: "web7", VNICs: 1}, []Domain{{Name: "big"}}, true,
			"admitted web7: its reservations (unnamedVMs: 100Mbps per vNIC, 1 vNICs) fit"},
		{"without vNICs it reserves nothing", Domain{Name: "web7"}, []Domain{{Name: "big"}}, true, "reserves nothing"},
	} {
		d := Decide(p, "h1", c.dom, c.running)
		if d.Allow != c.allow || !strings.Contains(d.String(), c.want) {
			t.Errorf("%s: %v, want allow=%v and %q", c.name, d, c.allow, c.want)
		}
	}
}
