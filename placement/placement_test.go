package placement

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/policy"
)

// The datadriven tests in testdata/ drive a cluster through policies,
// changes and placement passes. Commands:
//
//	policy            input: a policy file (YAML); the placement is the file's
//	change            input: one change per line (grammar in change.go)
//	demand            input: "VM cpu=MHZ mem=SIZE" or "VM/NIC net=RATE" lines
//	plan [threshold=N] [maxmoves=N] [netweight=F] [down=HOST/UPLINK,...]
//	                  one placement pass; its placement becomes the current one
//	rates             every vNIC's entitlement after the last pass
//	check             the faults of the current placement
//	passes n=N [threshold=N] [pattern=steady|alternate] [noise=F] [cooldown=false]
//	                  N passes, 5 minutes apart, with CPU demand following the
//	                  pattern; prints moves per pass and any ping-pong: a VM
//	                  that moves back to the host it left less than 12 passes
//	                  (an hour) before
//
// After every plan the harness checks invariants and prints violations:
// a pass that says OK while a reservation is unmet, a non-migratable VM
// that moved, more rebalancing moves than the cap, a move whose VM is not on
// its destination afterwards, a refused VM that runs.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{}
		datadriven.RunTest(t, path, h.run)
	})
}

type harness struct {
	p       *policy.Policy
	cur     Placement
	changed []string
	demand  Demand
	last    *Result
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "policy":
		p, err := policy.Decode("test.yaml", []byte(d.Input))
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		h.p, h.cur, h.changed, h.last = p, Placement{}, nil, nil
		h.demand = Demand{CPUMHz: map[string]float64{}, MemoryBytes: map[string]float64{}, NetBps: map[string]float64{}}
		for _, v := range p.VMs {
			if v.Host != "" {
				h.cur[v.Name] = v.Host
			}
		}
		return "ok\n"
	case "change":
		var b strings.Builder
		for _, line := range lines(d.Input) {
			c, err := ParseChange(line)
			if err != nil {
				fmt.Fprintf(&b, "%s: error: %v\n", line, err)
				continue
			}
			np, pl, err := c.Apply(h.p, h.cur)
			var re *RefusedError
			switch {
			case errors.As(err, &re):
				fmt.Fprintf(&b, "%s: refused: %s\n", line, re.Reason)
			case err != nil:
				fmt.Fprintf(&b, "%s: error: %v\n", line, err)
			default:
				h.p, h.cur = np, pl
				if vm := c.VM(np); vm != "" {
					h.changed = append(h.changed, vm)
				}
				fmt.Fprintf(&b, "%s: ok\n", line)
			}
		}
		return b.String()
	case "demand":
		for _, line := range lines(d.Input) {
			f := strings.Fields(line)
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "cpu":
					x, err := mhz(v, false)
					if err != nil {
						t.Fatalf("%s: %v", d.Pos, err)
					}
					h.demand.CPUMHz[f[0]] = float64(x)
				case "mem":
					x, err := policy.ParseSize(v)
					if err != nil {
						t.Fatalf("%s: %v", d.Pos, err)
					}
					h.demand.MemoryBytes[f[0]] = float64(x)
				case "net":
					x, err := policy.ParseRate(v)
					if err != nil {
						t.Fatalf("%s: %v", d.Pos, err)
					}
					h.demand.NetBps[f[0]] = float64(x)
				default:
					t.Fatalf("%s: unknown demand %q", d.Pos, k)
				}
			}
		}
		return "ok\n"
	case "plan":
		o := h.options(t, d)
		o.Changed = h.changed
		r := Plan(h.p, h.cur, h.demand, o)
		out := r.String() + h.violations(r, o)
		h.cur, h.changed, h.last = r.Placement, nil, &r
		return out
	case "check":
		var b strings.Builder
		for _, dc := range Check(h.p, h.cur, Options{}) {
			b.WriteString(dc.String() + "\n")
		}
		if b.Len() == 0 {
			return "ok: every reservation is met\n"
		}
		return b.String()
	case "rates":
		if h.last == nil {
			t.Fatalf("%s: rates before plan", d.Pos)
		}
		var b strings.Builder
		for _, pr := range Rates(h.p, *h.last, nil) {
			fmt.Fprintf(&b, "%s/%s %s %s\n", pr.Host, pr.Uplink, pr.Port, fmtRate(pr.RateBps))
			if pv := h.p.VM(strings.Split(pr.Port, "/")[0]); pv != nil {
				for _, n := range pv.NICs {
					if policy.PortName(pv.Name, n.Name) == pr.Port && pr.RateBps+1 < float64(n.Reservation) {
						fmt.Fprintf(&b, "VIOLATION: %s gets %s < its reservation %s\n", pr.Port, fmtRate(pr.RateBps), fmtRate(float64(n.Reservation)))
					}
				}
			}
		}
		return b.String()
	case "passes":
		return h.passes(t, d)
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

func (h *harness) options(t *testing.T, d *datadriven.TestData) Options {
	var o Options
	for _, a := range d.CmdArgs {
		if a.Key == "down" {
			o.DownUplinks = append(o.DownUplinks, a.Vals...)
			continue
		}
		if len(a.Vals) != 1 {
			continue
		}
		switch a.Key {
		case "threshold":
			o.Threshold = atoi(t, a.Vals[0])
		case "maxmoves":
			o.MaxMoves = atoi(t, a.Vals[0])
		case "netweight":
			f, err := strconv.ParseFloat(a.Vals[0], 64)
			if err != nil {
				t.Fatal(err)
			}
			o.NetworkWeight = f
		}
	}
	return o
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// violations recomputes the invariants of a pass from the outside.
func (h *harness) violations(r Result, o Options) string {
	var b strings.Builder
	faults := Check(h.p, r.Placement, Options{})
	if r.OK && len(faults) > 0 {
		fmt.Fprintf(&b, "VIOLATION: pass says OK but %d fault(s) remain: %s\n", len(faults), faults[0].Why)
	}
	noRepair := map[string]bool{}
	for _, d := range r.Decisions {
		if d.Kind == NoRepair {
			noRepair[d.Host] = true
		}
	}
	for _, f := range faults {
		if f.Host != "" && !noRepair[f.Host] {
			fmt.Fprintf(&b, "VIOLATION: host %s is broken after the pass and no no-repair says so\n", f.Host)
		}
	}
	rebal := 0
	for _, d := range r.Decisions {
		switch d.Kind {
		case Repair, Rebalance:
			if d.Kind == Rebalance {
				rebal++
			}
			if pv := h.p.VM(d.VM); pv != nil && !pv.Migratable {
				fmt.Fprintf(&b, "VIOLATION: %s is not migratable but moved\n", d.VM)
			}
			if r.Placement[d.VM] != d.To && !movedAgain(r, d) {
				fmt.Fprintf(&b, "VIOLATION: %s moved to %s but ends on %s\n", d.VM, d.To, r.Placement[d.VM])
			}
		case Refuse:
			if r.Placement[d.VM] != "" {
				fmt.Fprintf(&b, "VIOLATION: %s refused but placed on %s\n", d.VM, r.Placement[d.VM])
			}
		}
	}
	max := o.MaxMoves
	if max == 0 {
		max = 8
	}
	if rebal > max {
		fmt.Fprintf(&b, "VIOLATION: %d rebalancing moves > cap %d\n", rebal, max)
	}
	return b.String()
}

func movedAgain(r Result, d Decision) bool {
	n := 0
	for _, x := range r.Decisions {
		if x.IsMove() && x.VM == d.VM {
			n++
		}
	}
	return n > 1
}

// passes runs DRS passes 5 minutes apart. pattern steady: every VM's CPU
// demand is the same each pass, times (1 ± noise) from a fixed
// pseudo-random sequence; alternate: the VMs of even index demand 1+noise
// and the others 1-noise on even passes, the reverse on odd passes (a load
// that swings symmetrically between the two halves of the cluster).
func (h *harness) passes(t *testing.T, d *datadriven.TestData) string {
	n, pattern, noise, cooldown := 10, "steady", 0.0, true
	o := h.options(t, d)
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "n":
			n = atoi(t, a.Vals[0])
		case "pattern":
			pattern = a.Vals[0]
		case "noise":
			f, err := strconv.ParseFloat(a.Vals[0], 64)
			if err != nil {
				t.Fatal(err)
			}
			noise = f
		case "cooldown":
			cooldown = a.Vals[0] != "false"
		}
	}
	base := map[string]float64{}
	for k, v := range h.demand.CPUMHz {
		base[k] = v
	}
	last := map[string]LastMove{}
	type stay struct {
		host string
		pass int // the pass it arrived in
	}
	history := map[string][]stay{} // VM → hosts it was on
	var b strings.Builder
	seed := uint64(1)
	rnd := func() float64 { // deterministic, in [-1, 1)
		seed = seed*6364136223846793005 + 1442695040888963407
		return float64(seed>>11)/float64(1<<52) - 1
	}
	total := 0
	var perPass []string
	for pass := 0; pass < n; pass++ {
		dm := Demand{CPUMHz: map[string]float64{}, MemoryBytes: h.demand.MemoryBytes, NetBps: h.demand.NetBps}
		for i, v := range h.p.VMs {
			x := base[v.Name]
			switch pattern {
			case "steady":
				x *= 1 + noise*rnd()
			case "alternate":
				if (i%2 == 0) == (pass%2 == 0) {
					x *= 1 + noise
				} else {
					x *= 1 - noise
				}
			default:
				t.Fatalf("%s: unknown pattern %q", d.Pos, pattern)
			}
			dm.CPUMHz[v.Name] = x
		}
		po := o
		po.NowNs = int64(pass) * 300e9
		if cooldown {
			po.History = last
		}
		r := Plan(h.p, h.cur, dm, po)
		ms := r.Moves()
		total += len(ms)
		perPass = append(perPass, strconv.Itoa(len(ms)))
		r.Record(last, po.NowNs)
		for _, m := range ms {
			hist := history[m.VM]
			if len(hist) >= 2 && hist[len(hist)-2].host == m.To && pass-hist[len(hist)-1].pass < 12 {
				fmt.Fprintf(&b, "VIOLATION: ping-pong: %s back to %s at pass %d, %d passes after it left\n", m.VM, m.To, pass, pass-hist[len(hist)-1].pass)
			} else if h.cur[m.VM] == m.To {
				fmt.Fprintf(&b, "VIOLATION: %s moved to its own host at pass %d\n", m.VM, pass)
			}
			if len(hist) == 0 {
				history[m.VM] = append(history[m.VM], stay{h.cur[m.VM], -1})
			}
			history[m.VM] = append(history[m.VM], stay{m.To, pass})
		}
		if out := h.violations(r, o); out != "" {
			fmt.Fprintf(&b, "pass %d: %s", pass, out)
		}
		h.cur = r.Placement
		h.last = &r
	}
	var vms []string
	for v, hs := range history {
		if len(hs) > 2 {
			vms = append(vms, fmt.Sprintf("%s moved %d times", v, len(hs)-1))
		}
	}
	sort.Strings(vms)
	fmt.Fprintf(&b, "moves per pass: %s\ntotal moves: %d\n", strings.Join(perPass, " "), total)
	for _, v := range vms {
		fmt.Fprintf(&b, "%s\n", v)
	}
	fmt.Fprintf(&b, "placement: %s\n", h.cur)
	return b.String()
}
