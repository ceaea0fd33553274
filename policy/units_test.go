package policy

import (
	"strings"
	"testing"
	"time"
)

// TestUnits checks the unit parsers on exact values and on the messages of
// bad values.
func TestUnits(t *testing.T) {
	rates := []struct {
		in   string
		want Bps
		err  string
	}{
		{"9.4Gbps", 9_400_000_000, ""},
		{"7.5 Gbps", 7_500_000_000, ""},
		{"0.63Gbps", 630_000_000, ""},
		{"750Mbps", 750_000_000, ""},
		{"1e3Kbps", 1_000_000, ""},
		{"1.5bps", 2, ""}, // rounded half up to whole bits
		{"0", 0, ""},
		{"100Tbps", MaxRate, ""},
		{"101Tbps", 0, "too large"},
		{"10", 0, "no unit"},
		{"10GB/s", 0, "unknown unit"},
		{"-1Mbps", 0, "negative"},
		{"fast", 0, "cannot parse"},
		{"1/2Gbps", 0, "cannot parse"},
		{"NaNGbps", 0, "cannot parse"},
	}
	for _, c := range rates {
		got, err := ParseRate(c.in)
		if c.err == "" && (err != nil || got != c.want) {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseRate(%q) error = %v; want it to say %q", c.in, err, c.err)
		}
	}
	if got, err := ParseSize("1.5GiB"); err != nil || got != 3<<29 {
		t.Errorf("ParseSize(1.5GiB) = %d, %v", got, err)
	}
	for in, want := range map[string]time.Duration{"12ms": 12 * time.Millisecond, "4s": 4 * time.Second, "250us": 250 * time.Microsecond, "5µs": 5 * time.Microsecond} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for r, want := range map[Bps]string{9_400_000_000: "9.4Gbps", 630_000_000: "630Mbps", 0: "0bps", 999: "999bps", Unlimited: "unlimited"} {
		if got := FormatRate(r); got != want {
			t.Errorf("FormatRate(%d) = %q; want %q", r, got, want)
		}
	}
	for in, want := range map[string]int{"normal": 50, "high": 100, "low": 25, "7": 7} {
		if got, msg := parseShares(in, "network"); msg != "" || got != want {
			t.Errorf("parseShares(%q) = %d, %q", in, got, msg)
		}
	}
	if got, msg := parseShares("high", "storage"); msg != "" || got != 2000 {
		t.Errorf("storage high = %d %q", got, msg)
	}
}

// TestDefaults checks the defaults a minimal file gets.
func TestDefaults(t *testing.T) {
	p, err := Parse("min.yaml", []byte(`cluster: c
hosts: [{name: h, uplinks: [{name: u, speed: 10Gbps}]}]
trafficClasses: {nfs: , vmotion: {limit: 4Gbps}}
datastores: [{name: d}]
vms: [{name: v, cpu: {vcpus: 4, shares: high}, nics: [{name: n}], disks: [{name: k, datastore: d}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.ReservationCap != 0.75 || p.Hosts[0].Uplinks[0].Usable != 10_000_000_000 {
		t.Errorf("cap %v usable %d", p.ReservationCap, p.Hosts[0].Uplinks[0].Usable)
	}
	var declared []string
	for i, tc := range p.TrafficClasses {
		if tc.Name != TrafficClassNames[i] || tc.Shares != NetSharesNormal {
			t.Errorf("class %d = %+v", i, tc)
		}
		if tc.Declared {
			declared = append(declared, tc.Name)
		}
		if tc.Name != "vmotion" && tc.Limit != Unlimited {
			t.Errorf("class %s limit %d", tc.Name, tc.Limit)
		}
	}
	if strings.Join(declared, ",") != "nfs,vmotion" || p.TrafficClass("vmotion").Limit != 4_000_000_000 {
		t.Errorf("declared %v, vmotion %+v", declared, p.TrafficClass("vmotion"))
	}
	ds := p.Datastore("d")
	if ds.SIOC.CongestionThreshold != 30*time.Millisecond || ds.SIOC.ControlPeriod != 4*time.Second || ds.SIOC.Enabled {
		t.Errorf("sioc %+v", ds.SIOC)
	}
	vm := p.VM("v")
	if !vm.Migratable || vm.CPU.Shares != 4*CPUSharesHigh || vm.Host != "" {
		t.Errorf("vm %+v", vm)
	}
	n, k := vm.NICs[0], vm.Disks[0]
	if n.Shares != NetSharesNormal || n.Limit != Unlimited || k.Shares != StorageSharesNormal || k.LimitIOPS != UnlimitedIOPS {
		t.Errorf("nic %+v disk %+v", n, k)
	}
	if p.NICUplink(vm, &vm.NICs[0]) != "" {
		t.Error("unplaced VM has an uplink")
	}
}

// TestSizeCap: a file over MaxFileBytes is refused with one line, quickly.
func TestSizeCap(t *testing.T) {
	data := []byte("cluster: c\n" + strings.Repeat("# padding\n", MaxFileBytes/10+1))
	_, err := Parse("big.yaml", data)
	if err == nil || err.Error() != "big.yaml:1: larger than 8 MiB" {
		t.Fatalf("got %v", err)
	}
}
