package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestValidate runs testdata/validate.txt: each case parses one file
// (relative to testdata/) and prints either a summary or every problem,
// one `FILE:LINE: field: message` line each. Run with -rewrite to
// regenerate the expectations (then review the diff).
func TestValidate(t *testing.T) {
	datadriven.RunTest(t, "testdata/validate.txt", func(t *testing.T, d *datadriven.TestData) string {
		var file string
		d.ScanArgs(t, "file", &file)
		data, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		switch d.Cmd {
		case "validate":
			p, err := Parse(file, data)
			return render(t, file, p, err)
		case "decode":
			// Decode only: syntax, fields, units, references; then list
			// the admission problems separately.
			p, err := Decode(file, data)
			if err != nil {
				return render(t, file, nil, err)
			}
			if errs := p.Admission(); errs != nil {
				return "decoded; admission:\n" + render(t, file, nil, errs)
			}
			return render(t, file, p, nil)
		case "derive":
			p, err := Parse(file, data)
			if err != nil {
				return render(t, file, nil, err)
			}
			return derived(p)
		}
		t.Fatalf("unknown command %q", d.Cmd)
		return ""
	})
}

// render prints a parse result and checks the error format invariants.
func render(t *testing.T, file string, p *Policy, err error) string {
	if err != nil {
		if p != nil {
			t.Fatalf("%s: policy and error both returned", file)
		}
		errs, ok := err.(Errors)
		if !ok {
			t.Fatalf("%s: error is %T, want Errors", file, err)
		}
		if len(errs) == 0 {
			t.Fatalf("%s: empty Errors returned as error", file)
		}
		var b strings.Builder
		for i, e := range errs {
			line := e.Error()
			if strings.ContainsAny(line, "\n\r") {
				b.WriteString("VIOLATION: message spans lines\n")
			}
			if !strings.HasPrefix(line, fmt.Sprintf("%s:%d: ", file, e.Line)) || e.Line < 1 {
				b.WriteString("VIOLATION: not FILE:LINE: ...\n")
			}
			if i > 0 && errs[i-1].Line > e.Line {
				b.WriteString("VIOLATION: not in line order\n")
			}
			b.WriteString(line + "\n")
		}
		if err.Error()+"\n" != strings.ReplaceAll(b.String(), "VIOLATION: not in line order\n", "") && !strings.Contains(b.String(), "VIOLATION") {
			b.WriteString("VIOLATION: Errors.Error() differs from the lines\n")
		}
		return b.String()
	}
	nics, disks := 0, 0
	for _, vm := range p.VMs {
		nics += len(vm.NICs)
		disks += len(vm.Disks)
	}
	return fmt.Sprintf("ok: cluster %s, %d hosts, %d VMs, %d vNICs, %d disks, %d datastores\n%s",
		p.Cluster, len(p.Hosts), len(p.VMs), nics, disks, len(p.Datastores), checkInvariants(p))
}

// checkInvariants recomputes the admission rules on a valid policy from
// the derived views and reports any breach as a VIOLATION line.
func checkInvariants(p *Policy) string {
	var b strings.Builder
	if len(p.TrafficClasses) != len(TrafficClassNames) {
		fmt.Fprintf(&b, "VIOLATION: %d traffic classes\n", len(p.TrafficClasses))
	}
	for i, tc := range p.TrafficClasses {
		if i < len(TrafficClassNames) && tc.Name != TrafficClassNames[i] {
			fmt.Fprintf(&b, "VIOLATION: class %d is %s\n", i, tc.Name)
		}
		if tc.Reservation > tc.Limit || tc.Shares <= 0 {
			fmt.Fprintf(&b, "VIOLATION: class %s R/S/L\n", tc.Name)
		}
	}
	assign := p.UplinkAssignment()
	for _, h := range p.Hosts {
		a := p.AssignUplinks(&h, p.VMsOn(h.Name))
		for _, u := range h.Uplinks {
			var nics Bps
			for _, vm := range p.VMsOn(h.Name) {
				for _, n := range vm.NICs {
					port := PortName(vm.Name, n.Name)
					if assign[port] != a[port] {
						fmt.Fprintf(&b, "VIOLATION: %s assigned inconsistently\n", port)
					}
					if a[port] == u.Name {
						nics += n.Reservation
					}
				}
			}
			sum := nics + Bps(p.Classes().OtherBps)
			if vm := p.TrafficClass("vm"); vm.Reservation > 0 {
				sum = vm.Reservation + Bps(p.Classes().OtherBps)
				if nics > vm.Reservation {
					fmt.Fprintf(&b, "VIOLATION: %s/%s vNICs reserve %s > vm class\n", h.Name, u.Name, FormatRate(nics))
				}
			}
			if sum > p.Reservable(&u) {
				fmt.Fprintf(&b, "VIOLATION: %s/%s reserves %s > cap\n", h.Name, u.Name, FormatRate(sum))
			}
			if u.Usable > u.Speed || u.Usable <= 0 {
				fmt.Fprintf(&b, "VIOLATION: %s/%s usable\n", h.Name, u.Name)
			}
		}
	}
	for _, vm := range p.VMs {
		for i := range vm.NICs {
			nic := &vm.NICs[i]
			if nic.Reservation > nic.Limit || nic.Shares <= 0 {
				fmt.Fprintf(&b, "VIOLATION: %s R/S/L\n", PortName(vm.Name, nic.Name))
			}
			if got := p.NICUplink(&vm, nic); got != assign[PortName(vm.Name, nic.Name)] {
				fmt.Fprintf(&b, "VIOLATION: NICUplink(%s) = %q, assignment %q\n", PortName(vm.Name, nic.Name), got, assign[PortName(vm.Name, nic.Name)])
			}
		}
	}
	return b.String()
}

// derived prints the views other parts use: per uplink the effective
// class reservations and the vNICs that send through it.
func derived(p *Policy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "reservationCap %g\n", p.ReservationCap)
	u := p.UnnamedVMs
	fmt.Fprintf(&b, "unnamedVMs shares=%d reservation=%s limit=%s\n", u.Shares, FormatRate(u.Reservation), FormatRate(u.Limit))
	for _, tc := range p.TrafficClasses {
		if tc.Declared {
			fmt.Fprintf(&b, "class %s shares=%d reservation=%s limit=%s\n", tc.Name, tc.Shares, FormatRate(tc.Reservation), FormatRate(tc.Limit))
		}
	}
	for _, h := range p.Hosts {
		for _, u := range h.Uplinks {
			fmt.Fprintf(&b, "%s/%s speed=%s usable=%s reservable=%s vm-budget=%s\n", h.Name, u.Name,
				FormatRate(u.Speed), FormatRate(u.Usable), FormatRate(p.Reservable(&u)), FormatRate(p.VMClassBudget(&u)))
			a := p.AssignUplinks(&h, p.VMsOn(h.Name))
			var classes, ports []string
			for _, tc := range p.TrafficClasses {
				r := tc.Reservation
				if tc.Name == "vm" && r == 0 {
					for _, vm := range p.VMsOn(h.Name) {
						for _, n := range vm.NICs {
							if a[PortName(vm.Name, n.Name)] == u.Name {
								r += n.Reservation
							}
						}
					}
				}
				if r > 0 {
					classes = append(classes, tc.Name+"="+FormatRate(r))
				}
			}
			for _, vm := range p.VMsOn(h.Name) {
				for _, n := range vm.NICs {
					if port := PortName(vm.Name, n.Name); a[port] == u.Name {
						ports = append(ports, port)
					}
				}
			}
			sort.Strings(classes)
			fmt.Fprintf(&b, "  reserved: %s\n", strings.Join(classes, " "))
			fmt.Fprintf(&b, "  ports: %s\n", strings.Join(ports, " "))
		}
	}
	for _, vm := range p.VMs {
		fmt.Fprintf(&b, "vm %s host=%q vcpus=%d cpu-shares=%d memory=%s migratable=%v\n", vm.Name, vm.Host, vm.CPU.VCPUs, vm.CPU.Shares, formatSize(vm.Memory), vm.Migratable)
		for _, n := range vm.NICs {
			fmt.Fprintf(&b, "  nic %s pg=%s shares=%d r=%s l=%s", n.Name, n.PortGroup, n.Shares, FormatRate(n.Reservation), FormatRate(n.Limit))
			switch {
			case n.VF:
				lo, hi := n.VFTxRates()
				fmt.Fprintf(&b, " vf pf=%s min_tx_rate=%d max_tx_rate=%d", n.Uplink, lo, hi)
			case n.Passthrough:
				b.WriteString(" passthrough")
			}
			b.WriteString("\n")
		}
		for _, d := range vm.Disks {
			lim := "unlimited"
			if d.LimitIOPS != UnlimitedIOPS {
				lim = fmt.Sprint(d.LimitIOPS)
			}
			fmt.Fprintf(&b, "  disk %s ds=%s shares=%d r=%d l=%s size=%s\n", d.Name, d.Datastore, d.Shares, d.ReservationIOPS, lim, formatSize(d.Size))
		}
	}
	for _, ds := range p.Datastores {
		drv := ds.Driver
		if drv == "" {
			drv = fmt.Sprintf("auto(made:%s,else:%s)", ds.DriverAt(true), ds.DriverAt(false))
		}
		fmt.Fprintf(&b, "datastore %s driver=%s sioc=%v threshold=%s period=%s slots=%d service=%s array-iops=%d nominal-iops=%d quota=%d\n", ds.Name, drv, ds.SIOC.Enabled,
			ds.SIOC.CongestionThreshold, ds.SIOC.ControlPeriod, ds.Array.Slots, ds.Array.ServiceTime, ds.ArrayIOPS(), ds.NominalIOPS(), ds.IOPSQuota().Cap)
	}
	for _, np := range p.NetworkPools {
		fmt.Fprintf(&b, "pool %s reservation=%s portGroups=%v hosts=%v\n", np.Name, FormatRate(np.Reservation), np.PortGroups, np.Hosts)
	}
	b.WriteString(checkInvariants(p))
	return b.String()
}

// TestEveryBadFileIsCovered makes sure each file under testdata/bad has a
// case in validate.txt, so that adding a file without an expectation fails.
func TestEveryBadFileIsCovered(t *testing.T) {
	cases, err := os.ReadFile("testdata/validate.txt")
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("testdata/bad")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 20 {
		t.Errorf("only %d bad files", len(entries))
	}
	for _, e := range entries {
		if !strings.Contains(string(cases), "validate file=bad/"+e.Name()+"\n") {
			t.Errorf("testdata/bad/%s has no case in testdata/validate.txt", e.Name())
		}
	}
}
