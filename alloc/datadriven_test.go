package alloc

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs testdata/*.txt. Commands:
//
//	alloc capacity=9.4Gbps [sem=additive|floor] [prec=2]
//	explain capacity=9.4Gbps node=NAME [sem=...]
//
// The input is a tree of nodes under an implicit root, two spaces of
// indentation per level:
//
//	NAME [r=RATE] [s=SHARES] [l=RATE] [d=RATE] [sem=additive|floor]
//
// RATE is a number with an optional unit (bps, Kbps, Mbps, Gbps; none for
// IOPS) or "inf". Leaves default to unlimited demand, shares 50. The output
// lists every node with its allocation (in the capacity's unit) and reason,
// then any invariant violations that Check finds. Rewrite expectations with
// `go test ./alloc -run DataDriven -rewrite`.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			capStr := ""
			d.ScanArgs(t, "capacity", &capStr)
			capacity, unit, err := parseRate(capStr)
			if err != nil {
				d.Fatalf(t, "capacity: %v", err)
			}
			root := &Node{Name: "root", Limit: Inf, Demand: Inf}
			if d.HasArg("sem") {
				var s string
				d.ScanArgs(t, "sem", &s)
				root.Semantics = parseSem(t, d, s)
			}
			prec := 2
			if d.HasArg("prec") {
				d.ScanArgs(t, "prec", &prec)
			}
			if err := parseTree(d.Input, root); err != nil {
				return "error: " + err.Error() + "\n"
			}
			var s Solver
			s.Compute(root, capacity)
			num := func(v float64) string { return formatRate(v, unit, prec) }
			var b strings.Builder
			switch d.Cmd {
			case "alloc":
				if root.Reason != CapacityBound {
					fmt.Fprintf(&b, "(root) %s %s\n", num(root.Alloc), root.Reason)
				}
				printTree(&b, root, 0, num)
			case "explain":
				var name string
				d.ScanArgs(t, "node", &name)
				path := Find(root, name)
				if path == nil {
					return "error: no node " + name + "\n"
				}
				for _, l := range Describe(Explain(path), num) {
					b.WriteString(l + "\n")
				}
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			for _, v := range Check(root, capacity, 1e-9*math.Max(1, capacity)) {
				fmt.Fprintf(&b, "violation: %s\n", v)
			}
			return b.String()
		})
	})
}

func parseSem(t *testing.T, d *datadriven.TestData, s string) Semantics {
	switch s {
	case "additive":
		return Additive
	case "floor":
		return Floor
	}
	d.Fatalf(t, "unknown semantics %q", s)
	return 0
}

func printTree(b *strings.Builder, n *Node, depth int, num func(float64) string) {
	for _, c := range n.Children {
		fmt.Fprintf(b, "%s%s %s %s\n", strings.Repeat("  ", depth), c.Name, num(c.Alloc), c.Reason)
		printTree(b, c, depth+1, num)
	}
}

var units = []struct {
	suffix string
	scale  float64
}{{"Gbps", 1e9}, {"Mbps", 1e6}, {"Kbps", 1e3}, {"bps", 1}}

// parseRate parses "9.4Gbps", "500Mbps", "5000" or "inf"; it returns the
// value and the unit it was written in.
func parseRate(s string) (float64, string, error) {
	if s == "inf" {
		return Inf, "", nil
	}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			return v * u.scale, u.suffix, err
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	return v, "", err
}

func formatRate(v float64, unit string, prec int) string {
	if math.IsInf(v, 1) {
		return "inf"
	}
	for _, u := range units {
		if u.suffix == unit {
			return strconv.FormatFloat(v/u.scale, 'f', prec, 64) + unit
		}
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// parseTree reads indented node lines into root's subtree.
func parseTree(input string, root *Node) error {
	stack := []*Node{root}
	for i, line := range strings.Split(input, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if indent%2 != 0 || indent/2+1 > len(stack) {
			return fmt.Errorf("line %d: bad indentation", i+1)
		}
		stack = stack[:indent/2+1]
		f := strings.Fields(line)
		n := &Node{Name: f[0], Shares: 50, Limit: Inf, Demand: Inf}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("line %d: %q is not key=value", i+1, kv)
			}
			var err error
			switch k {
			case "r":
				n.Reservation, _, err = parseRate(v)
			case "s":
				n.Shares, err = strconv.ParseFloat(v, 64)
			case "l":
				n.Limit, _, err = parseRate(v)
			case "d":
				n.Demand, _, err = parseRate(v)
			case "sem":
				switch v {
				case "additive":
					n.Semantics = Additive
				case "floor":
					n.Semantics = Floor
				default:
					err = fmt.Errorf("unknown semantics %q", v)
				}
			default:
				err = fmt.Errorf("unknown key %q", k)
			}
			if err != nil {
				return fmt.Errorf("line %d: %s: %v", i+1, k, err)
			}
		}
		parent := stack[len(stack)-1]
		parent.Children = append(parent.Children, n)
		stack = append(stack, n)
	}
	return nil
}
