package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"sluice/internal/inputfile"
	"sluice/placement"
	"sluice/policy"
)

func init() {
	register(command{
		name:    "place",
		summary: "admission, placement, fault repair and rebalancing decisions, with reasons",
		run:     runPlace,
	})
}

const placeUsage = "usage: sluice place FILE [--change SPEC ...] [--batch] [--threshold 1-5] [--max-moves N]"

// placeArgs is the parsed command line of sluice place.
type placeArgs struct {
	file      string
	changes   []placement.Change
	batch     bool
	threshold int
	maxMoves  int
	help      bool
}

// placeFlags are place's flags as its help spells them.
var placeFlags = []string{"--change", "--batch", "--threshold", "--max-moves"}

func parsePlaceArgs(args []string) (placeArgs, error) {
	var a placeArgs
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			if a.file != "" {
				return a, usageError{msg: fmt.Sprintf("unexpected argument %s", arg)}
			}
			a.file = arg
			continue
		}
		name, val, hasVal := strings.Cut(arg, "=")
		switch name {
		case "-h", "--help", "-help":
			a.help = true
			continue
		case "--batch", "-batch":
			a.batch = true
			continue
		case "--change", "-change", "-c", "--threshold", "-threshold", "--max-moves", "-max-moves":
		default:
			return a, usageError{msg: "unknown flag " + name, flag: name, known: placeFlags}
		}
		if !hasVal {
			if i+1 >= len(args) {
				return a, usageError{msg: fmt.Sprintf("flag %s needs a value", name)}
			}
			i++
			val = args[i]
		}
		switch strings.TrimLeft(name, "-") {
		case "change", "c":
			c, err := placement.ParseChange(val)
			if err != nil {
				return a, usageError{msg: strings.TrimPrefix(err.Error(), "usage: ")}
			}
			a.changes = append(a.changes, c)
		case "threshold":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 5 {
				return a, usageError{msg: fmt.Sprintf("--threshold %s: want 1 (conservative) to 5 (aggressive)", val)}
			}
			a.threshold = n
		case "max-moves":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return a, usageError{msg: fmt.Sprintf("--max-moves %s: want a number ≥ 0", val)}
			}
			a.maxMoves = n
			if n == 0 {
				a.maxMoves = -1
			}
		}
	}
	if !a.help && a.file == "" {
		return a, usageError{msg: "missing FILE"}
	}
	return a, nil
}

// runPlace loads a policy (capacity breaches allowed: they are faults to
// repair), runs a placement pass on it as written, then applies each
// --change and runs a pass after each (the way DRS reacts to every
// reconfiguration), or after all of them with --batch. It prints the
// decisions, the placement and every vNIC's rate (demand unlimited).
func runPlace(args []string, stdout, stderr io.Writer) int {
	a, err := parsePlaceArgs(args)
	if ue, ok := err.(usageError); ok && ue.flag != "" {
		fmt.Fprintln(stderr, unknownFlag("place", ue.flag, ue.known))
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v; %s\n", err, placeUsage)
		return exitUsage
	}
	if a.help {
		fmt.Fprintln(stdout, helps["place"])
		return exitOK
	}
	data, err := inputfile.Read(a.file, policy.MaxFileBytes)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	p, err := policy.Decode(a.file, data)
	if err != nil {
		printPolicyError(stderr, err)
		return exitBad
	}
	// Check every change's names and values before printing anything.
	dry, dryCur := p, placement.Placement(nil)
	for _, c := range a.changes {
		np, pl, err := c.Apply(dry, dryCur)
		var re *placement.RefusedError
		if err != nil && !errors.As(err, &re) {
			fmt.Fprintf(stderr, "sluice: %v\n", err)
			return exitBad
		}
		if err == nil {
			dry, dryCur = np, pl
		}
	}
	o := placement.Options{Threshold: a.threshold, MaxMoves: a.maxMoves}
	fmt.Fprintf(stdout, "cluster %s: %s, %s\n", p.Cluster, plural(len(p.Hosts), "host"), plural(len(p.VMs), "VM"))

	fmt.Fprintf(stdout, "\n== pass 0: %s as written\n", a.file)
	r := placement.Plan(p, nil, placement.Demand{}, o)
	printPass(stdout, p, r)
	cur := r.Placement
	var changed []string
	pass := 0
	for i, c := range a.changes {
		np, pl, err := c.Apply(p, cur)
		var re *placement.RefusedError
		switch {
		case errors.As(err, &re):
			fmt.Fprintf(stdout, "\n== change %s\nrefuse change: %s; nothing changed\n", c.Spec, re.Reason)
			continue
		case err != nil:
			fmt.Fprintf(stderr, "sluice: %v\n", err)
			return exitBad
		}
		p, cur = np, pl
		if vm := c.VM(p); vm != "" {
			changed = append(changed, vm)
		}
		if a.batch && i < len(a.changes)-1 {
			fmt.Fprintf(stdout, "\n== change %s\n", c.Spec)
			continue
		}
		o.Changed = changed
		pass++
		fmt.Fprintf(stdout, "\n== change %s: pass %d\n", c.Spec, pass)
		r = placement.Plan(p, cur, placement.Demand{}, o)
		printPass(stdout, p, r)
		cur, changed = r.Placement, nil
	}
	return exitOK
}

// printPass prints a pass's decisions, the placement, and the rate of
// every vNIC with unlimited demand.
func printPass(w io.Writer, p *policy.Policy, r placement.Result) {
	io.WriteString(w, r.String())
	var line []string
	prev := ""
	flush := func() {
		if len(line) > 0 {
			fmt.Fprintf(w, "rates %s: %s\n", prev, strings.Join(line, ", "))
		}
		line = nil
	}
	for _, pr := range placement.Rates(p, r, nil) {
		up := pr.Host + "/" + pr.Uplink
		if up != prev {
			flush()
			prev = up
		}
		line = append(line, fmt.Sprintf("%s %.2fGbps", pr.Port, pr.RateBps/1e9))
	}
	flush()
}
