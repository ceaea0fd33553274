package entitle

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/alloc"
	"sluice/policy"
)

// TestDataDriven runs testdata/*.txt. The input of each command is a policy
// file (YAML). Commands:
//
//	network [demand=(PORT:RATE, ...)] [unnamed=(HOST/VM/NIC, ...)]
//	                                    every listed port's entitlement
//	explain port=PORT [demand=(...)] [unnamed=(...)]   Net.Explain
//	inbound, explain-inbound port=PORT     the same on the inbound trees
//
// unnamed lists vNICs of running VMs that the policy does not name
// (Live.Unnamed).
//
//	storage ds=NAME [capacity=IOPS] [demand=(DISK:IOPS, ...)]
//
// RATE is a policy rate ("2Gbps") or "unlimited". Every tree is checked
// with alloc.Check; violations are printed. Rewrite expectations with
// `go test ./entitle -run DataDriven -rewrite`.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			p, err := policy.Parse("policy.yaml", []byte(d.Input))
			if err != nil {
				return "policy error: " + err.Error() + "\n"
			}
			dem := map[string]float64{}
			if arg, ok := d.Arg("demand"); ok {
				for _, kv := range arg.Vals {
					name, v, ok := strings.Cut(kv, ":")
					if !ok {
						d.Fatalf(t, "demand %q: want NAME:VALUE", kv)
					}
					dem[name] = parseValue(t, d, v)
				}
			}
			var b strings.Builder
			switch d.Cmd {
			case "network", "explain", "inbound", "explain-inbound":
				var un []UnnamedVM
				if arg, ok := d.Arg("unnamed"); ok {
					for _, v := range arg.Vals {
						var err error
						if un, err = AddUnnamed(un, v); err != nil {
							d.Fatalf(t, "unnamed %v", err)
						}
					}
				}
				build := NetworkWith
				if strings.HasSuffix(d.Cmd, "inbound") {
					build = Inbound
				}
				n, err := build(p, un, dem)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				if d.Cmd == "network" || d.Cmd == "inbound" {
					for _, pt := range n.Ports {
						if !pt.Listed() {
							continue
						}
						fmt.Fprintf(&b, "%s %s %s r=%s s=%g l=%s d=%s -> %s %s\n", pt.Host, pt.Uplink, pt.Name,
							FormatBps(pt.ReservationBps()), pt.Node.Shares, FormatBps(pt.LimitBps()),
							FormatBps(pt.DemandBps()), FormatBps(pt.AllocBps()), pt.Node.Reason)
					}
				} else {
					var port string
					d.ScanArgs(t, "port", &port)
					lines, err := n.Explain(port)
					if err != nil {
						return "error: " + err.Error() + "\n"
					}
					b.WriteString(strings.Join(lines, "\n") + "\n")
				}
				for _, u := range n.Uplinks {
					for _, v := range alloc.Check(u.Root, u.CapacityBps, 1e-9*u.CapacityBps) {
						fmt.Fprintf(&b, "violation: %s\n", v)
					}
				}
			case "storage":
				var ds string
				d.ScanArgs(t, "ds", &ds)
				capacity := 0.0
				if d.HasArg("capacity") {
					d.ScanArgs(t, "capacity", &capacity)
				}
				s, err := Storage(p, ds, capacity, dem)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				fmt.Fprintf(&b, "%s capacity %s\n", s.Datastore, FormatIOPS(s.CapacityIOPS))
				for _, dk := range s.Disks {
					fmt.Fprintf(&b, "%s on %s r=%g s=%g l=%s -> %s %s\n", dk.Name, dk.Host, dk.Node.Reservation, dk.Node.Shares,
						FormatIOPS(dk.Node.Limit), FormatIOPS(dk.Node.Alloc), dk.Node.Reason)
				}
				for _, v := range alloc.Check(s.Root, s.CapacityIOPS, 1e-9*s.CapacityIOPS) {
					fmt.Fprintf(&b, "violation: %s\n", v)
				}
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			return b.String()
		})
	})
}

// parseValue is a plain number or ParseDemand's.
func parseValue(t *testing.T, d *datadriven.TestData, s string) float64 {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		return v
	}
	r, err := ParseDemand(s)
	if err != nil {
		d.Fatalf(t, "value %q: %v", s, err)
	}
	return r
}
