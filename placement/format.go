package placement

import (
	"fmt"
	"math"
	"sluice/entitle"
	"sort"
	"strconv"
	"strings"
)

// fmtRate renders bits/s as everywhere else in sluice (entitle.FormatBps):
// 7.5Gbps, 633.33Mbps.
func fmtRate(bps float64) string { return entitle.FormatBps(bps) }

// fmtBytes renders a size with the largest binary unit ≥ 1.
func fmtBytes(b float64) string {
	units := []struct {
		n string
		v float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if math.Abs(b) >= u.v {
			return trim(b/u.v) + u.n
		}
	}
	return trim(b) + "B"
}

func fmtSeconds(x float64) string { return trim(x) + "s" }

// trim prints v with at most three decimals and no trailing zeros.
func trim(v float64) string {
	s := strconv.FormatFloat(math.Round(v*1000)/1000, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// String renders the decision as one line, with details indented below.
func (d Decision) String() string {
	var b strings.Builder
	switch d.Kind {
	case Admit:
		fmt.Fprintf(&b, "admit %s on %s: %s", d.VM, d.To, d.Why)
	case Refuse:
		fmt.Fprintf(&b, "refuse %s: %s", d.VM, d.Why)
	case Repair, Rebalance:
		fmt.Fprintf(&b, "move %s %s -> %s: %s", d.VM, d.From, d.To, d.Why)
	case NoRepair:
		fmt.Fprintf(&b, "no-repair %s: %s", d.Host, d.Why)
	case Fault:
		fmt.Fprintf(&b, "fault: %s", d.Why)
	}
	for _, l := range d.Details {
		b.WriteString("\n  " + l)
	}
	return b.String()
}

// String renders the result: the decisions, then the placement by host.
func (r Result) String() string {
	var b strings.Builder
	for _, d := range r.Decisions {
		b.WriteString(d.String() + "\n")
	}
	if len(r.Decisions) == 0 {
		b.WriteString("no change: every reservation is met and the cluster is balanced enough\n")
	}
	fmt.Fprintf(&b, "placement: %s\n", r.Placement.String())
	fmt.Fprintf(&b, "imbalance: %.3f -> %.3f (threshold %d tolerates %s)\n", r.ImbalanceBefore, r.ImbalanceAfter, r.Threshold, fmtTarget(r.Target))
	return b.String()
}

func fmtTarget(t float64) string {
	if math.IsInf(t, 1) {
		return "any; repairs only"
	}
	return fmt.Sprintf("%.3f", t)
}

// String renders a placement by host: "h1: vm1 vm3 | h2: vm2", hosts and
// VMs sorted by name.
func (p Placement) String() string {
	by := map[string][]string{}
	for v, h := range p {
		if h != "" {
			by[h] = append(by[h], v)
		}
	}
	hs := make([]string, 0, len(by))
	for h := range by {
		hs = append(hs, h)
	}
	sort.Strings(hs)
	parts := make([]string, len(hs))
	for i, h := range hs {
		sort.Strings(by[h])
		parts[i] = h + ": " + strings.Join(by[h], " ")
	}
	if len(parts) == 0 {
		return "(nothing running)"
	}
	return strings.Join(parts, " | ")
}
