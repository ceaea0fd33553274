package explain

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/entitle"
	"sluice/policy"
)

// TestDataDriven runs testdata/*.txt. The input of each case is a policy
// file (YAML); the command:
//
//	explain port=NAME [demand=(PORT:RATE, ...)] [unnamed=(HOST/VM/NIC, ...)]
//	        [hosts=(VM:HOST, ...)] [cpu-mhz-per-gbps=MHZ] [local]
//
// hosts is where the VMs run (entitle.Live.Hosts: a VM it does not name
// runs nowhere); without it every VM runs on its policy host. local adds
// a HostLocal hook that says "local: HOST DISK". The output is Lines'
// lines, or its error. The harness checks that the lines are the same
// computed twice and that the hook's lines only end an explanation (the
// lines without it come first, unchanged); it prints any violation.
// Rewrite expectations with `go test ./explain -rewrite`.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "explain" {
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			p, err := policy.Parse("policy.yaml", []byte(d.Input))
			if err != nil {
				return "policy error: " + err.Error() + "\n"
			}
			var port string
			d.ScanArgs(t, "port", &port)
			if arg, ok := d.Arg("measured"); ok {
				m := map[string]float64{}
				for _, v := range arg.Vals {
					ds, iops, _ := strings.Cut(v, ":")
					f, err := strconv.ParseFloat(iops, 64)
					if err != nil {
						d.Fatalf(t, "measured %q: %v", v, err)
					}
					m[ds] = f
				}
				p = p.WithMeasuredIOPS(m)
			}
			live, opt := scanLive(t, d), scanOptions(t, d)
			lines, err := Lines(p, live, port, opt)
			if err != nil {
				return fmt.Sprintf("error: %v (ErrNoSuchPort: %t)\n", err, errors.Is(err, ErrNoSuchPort))
			}
			var b strings.Builder
			for _, l := range lines {
				b.WriteString(l + "\n")
			}
			if again, _ := Lines(p, live, port, opt); !slices.Equal(again, lines) {
				fmt.Fprintf(&b, "violation: computed again:\n%s\n", strings.Join(again, "\n"))
			}
			opt.HostLocal = nil
			if plain, _ := Lines(p, live, port, opt); len(plain) > len(lines) || !slices.Equal(plain, lines[:len(plain)]) {
				fmt.Fprintf(&b, "violation: without host-local lines:\n%s\n", strings.Join(plain, "\n"))
			}
			return b.String()
		})
	})
}

func scanLive(t *testing.T, d *datadriven.TestData) entitle.Live {
	var live entitle.Live
	if arg, ok := d.Arg("unnamed"); ok {
		for _, v := range arg.Vals {
			var err error
			if live.Unnamed, err = entitle.AddUnnamed(live.Unnamed, v); err != nil {
				d.Fatalf(t, "unnamed %v", err)
			}
		}
	}
	if arg, ok := d.Arg("hosts"); ok {
		live.Hosts = map[string]string{}
		for _, v := range arg.Vals {
			if v == "" {
				continue // hosts=(): every VM runs nowhere
			}
			vm, host, ok := strings.Cut(v, ":")
			if !ok {
				d.Fatalf(t, "hosts %q: want VM:HOST", v)
			}
			live.Hosts[vm] = host
		}
	}
	return live
}

func scanOptions(t *testing.T, d *datadriven.TestData) Options {
	var opt Options
	if arg, ok := d.Arg("demand"); ok {
		opt.DemandBps = map[string]float64{}
		for _, kv := range arg.Vals {
			name, v, ok := strings.Cut(kv, ":")
			if !ok {
				d.Fatalf(t, "demand %q: want PORT:RATE", kv)
			}
			opt.DemandBps[name] = parseRate(t, d, v)
		}
	}
	if d.HasArg("cpu-mhz-per-gbps") {
		d.ScanArgs(t, "cpu-mhz-per-gbps", &opt.CPUMHzPerGbps)
		opt.CPUCostSource = "--cpu-mhz-per-gbps"
	}
	if d.HasArg("local") {
		opt.HostLocal = func(host, disk string) []string { return []string{"local: " + host + " " + disk} }
	}
	return opt
}

// parseRate is a plain number of bits/s or entitle.ParseDemand's.
func parseRate(t *testing.T, d *datadriven.TestData, s string) float64 {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		return v
	}
	r, err := entitle.ParseDemand(s)
	if err != nil {
		d.Fatalf(t, "rate %q: %v", s, err)
	}
	return r
}
