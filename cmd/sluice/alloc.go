package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"sluice/entitle"
)

func init() {
	register(command{
		name:    "alloc",
		summary: "entitlement of every port and traffic class on every uplink",
		run:     runAlloc,
	})
}

const allocUsage = "usage: sluice alloc FILE [--demand PORT=RATE ...] [--unnamed HOST/VM/NIC ...] [-o table|json]"

// netArgs are the arguments that alloc and explain share.
type netArgs struct {
	file    string
	rest    []string // positional arguments after FILE
	demands map[string]float64
	// unnamed are vNICs of running VMs that the policy does not name
	// (--unnamed HOST/VM/NIC): ports with the policy's unnamedVMs.
	unnamed []entitle.UnnamedVM
	output  string
	help    bool
}

// usageError is a command line that does not parse (exit 2).
type usageError struct {
	msg string
	// flag is an unknown flag, known the command's (for a did-you-mean):
	// unknownFlag words it.
	flag  string
	known []string
}

func (e usageError) Error() string { return e.msg }

// netFlags are the flags parseNetArgs takes (alloc and explain), as the
// help spells them; explain also takes --cpu-mhz-per-gbps.
var netFlags = []string{"--demand", "--unnamed", "-o"}

// parseNetArgs reads FILE, positional arguments, --demand PORT=RATE
// (repeatable; RATE a policy rate or "unlimited") and -o FORMAT, in any
// order. A malformed command line is a usageError; a RATE that does not
// parse is a plain error (bad input).
func parseNetArgs(args []string) (netArgs, error) {
	a := netArgs{demands: map[string]float64{}, output: "table"}
	var pos []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, val, hasVal := strings.Cut(arg, "=")
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			pos = append(pos, arg)
			continue
		}
		switch name {
		case "-h", "--help", "-help":
			a.help = true
			continue
		case "--demand", "-demand", "-d", "-o", "--output", "-output", "--unnamed", "-unnamed":
		default:
			return a, usageError{msg: "unknown flag " + name, flag: name, known: netFlags}
		}
		if !hasVal {
			if i+1 >= len(args) {
				return a, usageError{msg: fmt.Sprintf("flag %s needs a value", name)}
			}
			i++
			val = args[i]
		}
		if name == "-o" || name == "--output" || name == "-output" {
			if val != "table" && val != "json" {
				return a, usageError{msg: fmt.Sprintf("-o %s: the output format is table or json", val)}
			}
			a.output = val
			continue
		}
		if name == "--unnamed" || name == "-unnamed" {
			if err := a.addUnnamed(val); err != nil {
				return a, err
			}
			continue
		}
		port, r, ok := strings.Cut(val, "=")
		if !ok || port == "" {
			return a, usageError{msg: fmt.Sprintf("--demand %s: want PORT=RATE, e.g. vm1/nic0=2Gbps", val)}
		}
		bps, err := entitle.ParseDemand(r)
		if err != nil {
			return a, fmt.Errorf("--demand %s: %v", val, err)
		}
		a.demands[port] = bps
	}
	if a.help {
		return a, nil
	}
	if len(pos) == 0 {
		return a, usageError{msg: "missing FILE"}
	}
	a.file, a.rest = pos[0], pos[1:]
	return a, nil
}

// addUnnamed adds a vNIC HOST/VM/NIC of a running VM that the policy does
// not name.
func (a *netArgs) addUnnamed(val string) error {
	un, err := entitle.AddUnnamed(a.unnamed, val)
	if err != nil {
		return usageError{msg: "--unnamed " + err.Error()}
	}
	a.unnamed = un
	return nil
}

// parseOrExit parses the shared arguments, printing the problem and
// returning the exit code when they do not parse (ok false).
func parseOrExit(cmd string, args []string, usage string, stdout, stderr io.Writer) (netArgs, int, bool) {
	a, err := parseNetArgs(args)
	if err != nil {
		if ue, isUsage := err.(usageError); isUsage && ue.flag != "" {
			fmt.Fprintln(stderr, unknownFlag(cmd, ue.flag, ue.known))
			return a, exitUsage, false
		} else if isUsage {
			fmt.Fprintf(stderr, "sluice: %v; %s\n", err, usage)
			return a, exitUsage, false
		}
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return a, exitBad, false
	}
	if a.help {
		fmt.Fprintln(stdout, usage)
		return a, exitOK, false
	}
	return a, exitOK, true
}

func runAlloc(args []string, stdout, stderr io.Writer) int {
	a, code, ok := parseOrExit("alloc", args, allocUsage, stdout, stderr)
	if !ok {
		return code
	}
	if len(a.rest) > 0 {
		fmt.Fprintf(stderr, "sluice: unexpected argument %s; %s\n", a.rest[0], allocUsage)
		return exitUsage
	}
	p, code := loadPolicy(a.file, stderr)
	if p == nil {
		return code
	}
	n, err := entitle.NetworkWith(p, a.unnamed, a.demands)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	in, err := entitle.Inbound(p, a.unnamed, nil)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	ports, inPorts := n.Listed(), in.Controlled()
	if a.output == "json" {
		return writeAllocJSON(append(ports, inPorts...), stdout, stderr)
	}
	writeAllocTable(ports, stdout)
	if len(inPorts) > 0 {
		fmt.Fprintln(stdout, "\ninbound: what each uplink receives towards the vNICs with ingress (demands unbounded)")
		writeAllocTable(inPorts, stdout)
	}
	return exitOK
}

func writeAllocTable(ports []*entitle.Port, stdout io.Writer) {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tUPLINK\tPORT\tRESERVATION\tSHARES\tLIMIT\tDEMAND\tALLOC\tREASON")
	for _, pt := range ports {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\t%s\t%s\n", pt.Host, pt.Uplink, pt.Name,
			entitle.FormatBps(pt.ReservationBps()), pt.Node.Shares, entitle.FormatBps(pt.LimitBps()),
			entitle.FormatBps(pt.DemandBps()), entitle.FormatBps(pt.AllocBps()), pt.Node.Reason)
	}
	tw.Flush()
}

// allocRow is one object of `sluice alloc -o json`. Rates are integer
// bits/s; limit_bps and demand_bps are null when unlimited.
type allocRow struct {
	Host           string `json:"host"`
	Uplink         string `json:"uplink"`
	Port           string `json:"port"`
	Kind           string `json:"kind"`  // vnic or class
	Class          string `json:"class"` // traffic class; "vm" for vNICs
	ReservationBps int64  `json:"reservation_bps"`
	Shares         int64  `json:"shares"`
	LimitBps       *int64 `json:"limit_bps"`
	DemandBps      *int64 `json:"demand_bps"`
	AllocBps       int64  `json:"alloc_bps"`
	Reason         string `json:"reason"`
	// Direction is "inbound" for what the uplink receives towards the
	// port (its ingress setting); absent for what it sends.
	Direction string `json:"direction,omitempty"`
}

func writeAllocJSON(ports []*entitle.Port, stdout, stderr io.Writer) int {
	rows := make([]allocRow, 0, len(ports))
	for _, pt := range ports {
		rows = append(rows, allocRow{
			Host: pt.Host, Uplink: pt.Uplink, Port: pt.Name, Kind: pt.Kind, Class: pt.Class,
			ReservationBps: int64(math.Round(pt.ReservationBps())),
			Shares:         int64(math.Round(pt.Node.Shares)),
			LimitBps:       optBps(pt.LimitBps()),
			DemandBps:      optBps(pt.DemandBps()),
			AllocBps:       int64(math.Round(pt.AllocBps())),
			Reason:         pt.Node.Reason.String(),
			Direction:      inboundOr(pt),
		})
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	return exitOK
}

// optBps is nil for an unlimited rate, else the rate rounded to bits/s.
func optBps(v float64) *int64 {
	if math.IsInf(v, 1) {
		return nil
	}
	r := int64(math.Round(v))
	return &r
}

// inboundOr is "inbound" for a port of an inbound tree, else "".
func inboundOr(pt *entitle.Port) string {
	if pt.Tree.Spec.Inbound {
		return "inbound"
	}
	return ""
}
