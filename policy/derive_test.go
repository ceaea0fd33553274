package policy

import "testing"

// TestNICUplinkFirstFit: vNICs go to the first uplink with vm-class room,
// in file order; a pinned vNIC stays where it is pinned; the vm class
// reservations are summed per uplink (entitle.Derive turns them into the
// vm class's reservation).
func TestNICUplinkFirstFit(t *testing.T) {
	p, err := Parse("two.yaml", []byte(`cluster: c
hosts:
  - name: h
    uplinks: [{name: u0, speed: 10Gbps}, {name: u1, speed: 10Gbps}]
trafficClasses: {vmotion: {reservation: 1.5Gbps}}
vms:
  - {name: a, host: h, nics: [{name: n, reservation: 4Gbps}]}
  - {name: b, host: h, nics: [{name: n, reservation: 3Gbps}]}
  - {name: c, host: h, nics: [{name: n, reservation: 2Gbps}]}
  - {name: d, host: h, nics: [{name: n, uplink: u1}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	// Budget per uplink: 0.75 × 10 − 1.5 = 6 Gbps. a → u0 (2 left),
	// b → u1 (3 left), c → u0 (0 left), d pinned → u1.
	want := map[string]string{"a": "u0", "b": "u1", "c": "u0", "d": "u1"}
	for vm, u := range want {
		v := p.VM(vm)
		if got := p.NICUplink(v, &v.NICs[0]); got != u {
			t.Errorf("NICUplink(%s) = %s, want %s", vm, got, u)
		}
	}
	reserved := map[string]Bps{}
	at := p.AssignUplinks(p.Host("h"), p.VMsOn("h"))
	for _, v := range p.VMsOn("h") {
		reserved[at[PortName(v.Name, "n")]] += v.NICs[0].Reservation
	}
	for u, want := range map[string]Bps{"u0": 6_000_000_000, "u1": 3_000_000_000} {
		if got := reserved[u]; got != want {
			t.Errorf("vNIC reservations on %s = %d, want %d", u, got, want)
		}
	}
	if p.Host("x") != nil || p.VM("x") != nil || p.Datastore("x") != nil {
		t.Error("unknown names must give zero values")
	}
}
