package hclock

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/alloc"
)

// TestDataDriven runs testdata/*.txt. Regenerate expectations with
// `go test ./hclock -run DataDriven -rewrite` and review the diff.
//
// Commands:
//
//	tree                     one node per line: NAME [parent=P] [r=RATE] [s=N] [l=RATE] [q=N] [qbytes=N]
//	run link=RATE (packets=N | dur=T) [seed=N] [warmup=F]
//	                         sources, one per line: PORT greedy [size=B|mix] [start=T]
//	                         or PORT rate=RATE [burst=N] [size=B|mix]; and events
//	                         `at=T set NODE [r=] [s=] [l=]` or `at=T mark` (a phase
//	                         boundary only). Prints per phase what
//	                         each node got against alloc's entitlement.
//	random seed=N classes=N ports=N packets=N demand=greedy|bursty|mixed [size=B|mix]
//	                         a random admissible tree, run like `run`.
//	ops                      API calls on a fresh scheduler, one per line:
//	                         enqueue PORT BYTES @T | dequeue @T | set NODE [r=] [s=] [l=] @T | stats NODE
//	lag link=RATE dur=T [seed=N]   sources as in run; ports with start=T are
//	                         checked for bursts from when they become busy; with
//	                         one event `at=T set NODE ...`, the ports below NODE
//	                         are checked from T against the new entitlements.
//
// Every result is checked against invariants and violations are printed:
// each node within 1% of its entitlement, no limit exceeded, the link busy
// whenever demand covers it, and (lag) the burst bound.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var tree *ttree
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "tree":
				tr, err := parseTree(d.Input)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				if _, err := New(tr.config()); err != nil {
					return "error: " + err.Error() + "\n"
				}
				tree = tr
				return describe(tr)
			case "run":
				if tree == nil {
					t.Fatal("run before tree")
				}
				return runCmd(t, tree, d.CmdArgs, d.Input)
			case "random":
				return randomCmd(t, d.CmdArgs)
			case "ops":
				if tree == nil {
					t.Fatal("ops before tree")
				}
				return opsCmd(t, tree, d.Input)
			case "lag":
				if tree == nil {
					t.Fatal("lag before tree")
				}
				return lagCmd(t, tree, d.CmdArgs, d.Input)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func args(d []datadriven.CmdArg) map[string]string {
	m := map[string]string{}
	for _, a := range d {
		m[a.Key] = strings.Join(a.Vals, ",")
	}
	return m
}

func describe(t *ttree) string {
	var b strings.Builder
	for i, n := range t.nodes {
		kind := "node"
		if n.parent == "" {
			kind = "root"
		} else if t.isPort(i) {
			kind = "port"
		}
		fmt.Fprintf(&b, "%s%s %s r=%s s=%g l=%s\n", strings.Repeat("  ", t.depth(i)), kind, n.name,
			fmtRate(n.p.ReservationBps), n.p.Shares, fmtRate(limitOrInf(n.p.LimitBps)))
	}
	return b.String()
}

func limitOrInf(l float64) float64 {
	if unlimited(l) {
		return math.Inf(1)
	}
	return l
}

// parseSources reads source and event lines.
func parseSources(t *testing.T, tr *ttree, input string) ([]*source, []event) {
	var srcs []*source
	var evs []event
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		m, bare := kv(f)
		if at, ok := m["at"]; ok {
			ns, err := parseDur(at)
			if err == nil && len(bare) == 1 && bare[0] == "mark" {
				// A phase boundary only (e.g. where a source starts).
				evs = append(evs, event{atNs: ns, node: -1})
				continue
			}
			if err != nil || len(bare) != 2 || bare[0] != "set" {
				t.Fatalf("bad event %q", line)
			}
			id, ok := tr.idx[bare[1]]
			if !ok {
				t.Fatalf("unknown node %q", bare[1])
			}
			evs = append(evs, event{atNs: ns, node: id, p: setParams(t, Params{}, m)})
			continue
		}
		id, ok := tr.idx[bare[0]]
		if !ok || !tr.isPort(id) {
			t.Fatalf("%q is not a port", bare[0])
		}
		src := &source{port: id, size: 1500, burst: 8}
		if len(bare) > 1 && bare[1] == "greedy" {
			src.greedy = true
		}
		for k, v := range m {
			var err error
			switch k {
			case "rate":
				src.rateBps, err = parseRate(v)
			case "burst":
				src.burst, err = strconv.Atoi(v)
			case "size":
				if v == "mix" {
					src.size = 0
				} else {
					src.size, err = strconv.Atoi(v)
				}
			case "start":
				src.startNs, err = parseDur(v)
			default:
				err = fmt.Errorf("unknown field %q", k)
			}
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
		}
		if !src.greedy && src.rateBps <= 0 {
			t.Fatalf("%q: want greedy or rate=", line)
		}
		srcs = append(srcs, src)
	}
	slices.SortFunc(evs, func(a, b event) int { return int(a.atNs - b.atNs) })
	return srcs, evs
}

// setParams applies r=, s=, l= from m over the node's current params.
func setParams(t *testing.T, p Params, m map[string]string) Params {
	p.ReservationBps, p.Shares, p.LimitBps = -1, -1, -1
	for k, v := range m {
		var err error
		switch k {
		case "r":
			p.ReservationBps, err = parseRate(v)
		case "l":
			p.LimitBps, err = parseRate(v)
		case "s":
			p.Shares, err = strconv.ParseFloat(v, 64)
		case "at":
		default:
			err = fmt.Errorf("unknown field %q", k)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// merge overlays the set (≥ 0) fields of upd on p.
func merge(p, upd Params) Params {
	if upd.ReservationBps >= 0 {
		p.ReservationBps = upd.ReservationBps
	}
	if upd.Shares >= 0 {
		p.Shares = upd.Shares
	}
	if upd.LimitBps >= 0 {
		p.LimitBps = upd.LimitBps
	}
	return p
}

type runOpts struct {
	linkBps float64
	packets int
	durNs   int64
	seed    uint64
	warmup  float64
}

func parseRunOpts(t *testing.T, a map[string]string) runOpts {
	o := runOpts{seed: 1, warmup: 0.1}
	var err error
	if o.linkBps, err = parseRate(a["link"]); err != nil {
		t.Fatal(err)
	}
	if v, ok := a["packets"]; ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		o.packets = int(f)
	}
	if v, ok := a["dur"]; ok {
		if o.durNs, err = parseDur(v); err != nil {
			t.Fatal(err)
		}
	}
	if v, ok := a["seed"]; ok {
		s, _ := strconv.Atoi(v)
		o.seed = uint64(s)
	}
	if v, ok := a["warmup"]; ok {
		o.warmup, _ = strconv.ParseFloat(v, 64)
	}
	if (o.packets > 0) == (o.durNs > 0) {
		t.Fatal("run: give exactly one of packets= and dur=")
	}
	return o
}

func runCmd(t *testing.T, tr *ttree, cmdArgs []datadriven.CmdArg, input string) string {
	o := parseRunOpts(t, args(cmdArgs))
	srcs, evs := parseSources(t, tr, input)
	out, _ := simulate(t, tr, o, srcs, evs, false)
	return out
}

// simulate runs the link model phase by phase and reports each phase.
// It returns the report and the largest relative error of a port.
func simulate(t *testing.T, tr *ttree, o runOpts, srcs []*source, evs []event, portsOnly bool) (string, float64) {
	l, err := newLinkSim(tr, o.linkBps, o.seed)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range srcs {
		l.add(s)
	}
	params := make([]Params, len(tr.nodes))
	for i, n := range tr.nodes {
		params[i] = n.p
	}
	var b strings.Builder
	worst := 0.0
	if o.packets > 0 {
		if len(evs) > 0 {
			t.Fatal("events need dur=, not packets=")
		}
		warm := int(o.warmup * float64(o.packets))
		for l.packets < warm && l.step(Never) {
		}
		s0, a0, t0, b0 := l.snapshot()
		for l.packets < o.packets && l.step(Never) {
		}
		s1, a1, t1, b1 := l.snapshot()
		fmt.Fprintf(&b, "%d packets, measured over the last %d\n", l.packets, o.packets-warm)
		worst = report(&b, tr, l, params, s0, a0, t0, b0, s1, a1, t1, b1, portsOnly)
		return b.String(), worst
	}
	bounds := []int64{}
	for _, e := range evs {
		bounds = append(bounds, e.atNs)
	}
	bounds = append(bounds, o.durNs)
	start := int64(0)
	ei := 0
	for pi, end := range bounds {
		for ; ei < len(evs) && evs[ei].atNs <= l.nowNs; ei++ {
			e := evs[ei]
			if e.node < 0 {
				continue
			}
			params[e.node] = merge(params[e.node], e.p)
			if err := l.s.SetParams(e.node, params[e.node], l.nowNs); err != nil {
				fmt.Fprintf(&b, "set %s: error: %v\n", tr.nodes[e.node].name, err)
			} else {
				fmt.Fprintf(&b, "at %s: set %s r=%s s=%g l=%s\n", fmtDur(e.atNs), tr.nodes[e.node].name,
					fmtRate(params[e.node].ReservationBps), params[e.node].Shares, fmtRate(limitOrInf(params[e.node].LimitBps)))
			}
		}
		warmEnd := start + int64(o.warmup*float64(end-start))
		for l.nowNs < warmEnd && l.step(warmEnd) {
		}
		s0, a0, t0, b0 := l.snapshot()
		for l.nowNs < end && l.step(end) {
		}
		s1, a1, t1, b1 := l.snapshot()
		fmt.Fprintf(&b, "phase %d: %s..%s, measured after %s\n", pi+1, fmtDur(start), fmtDur(end), fmtDur(warmEnd))
		worst = max(worst, report(&b, tr, l, params, s0, a0, t0, b0, s1, a1, t1, b1, portsOnly))
		start = end
	}
	return b.String(), worst
}

func fmtDur(ns int64) string {
	switch {
	case ns >= 1e9 && ns%1e6 == 0 && ns%1e9 == 0:
		return strconv.FormatInt(ns/1e9, 10) + "s"
	case ns >= 1e6:
		return strconv.FormatFloat(float64(ns)/1e6, 'f', -1, 64) + "ms"
	default:
		return strconv.FormatFloat(float64(ns)/1e3, 'f', -1, 64) + "us"
	}
}

// Tolerances of the invariants.
const (
	relTol   = 0.01  // a node's rate vs its entitlement (plus one largest packet over the window)
	limitTol = 0.001 // a node's rate vs its limit
	busyTol  = 0.999 // link utilisation when demand covers it
	// boundaryTol: a bursty port with average demand up to this much above
	// its share is on the share/demand boundary (see report).
	boundaryTol = 0.05
)

// report prints one measurement window and the invariant violations, and
// returns the largest relative error of a port.
func report(b *strings.Builder, tr *ttree, l *linkSim, params []Params,
	s0, a0 []float64, t0, b0 int64, s1, a1 []float64, t1, b1 int64, portsOnly bool) float64 {
	dt := float64(t1-t0) / 1e9
	demand := make([]float64, len(tr.nodes))
	for i := range tr.nodes {
		if !tr.isPort(i) {
			continue
		}
		src := l.bySrc[i]
		switch {
		case src == nil:
			demand[i] = 0
		case src.greedy && src.startNs <= t0:
			demand[i] = math.Inf(1)
		default:
			demand[i] = (a1[i] - a0[i]) * 8 / dt
		}
	}
	ref := reference(tr, params, demand, l.linkBps)
	// A window cuts packets whole: a node's bytes are known to within one
	// packet, which matters for ports that get only some hundred 64 KB
	// segments in the window.
	maxPkt := 0
	for _, src := range l.srcs {
		if src.size == 0 {
			maxPkt = max(maxPkt, 65536)
		} else {
			maxPkt = max(maxPkt, src.size)
		}
	}
	quantumBps := float64(maxPkt) * 8 / dt
	var viol []string
	worst := 0.0
	busy := float64(b1-b0) / float64(t1-t0)
	rootID := 0
	for i, n := range tr.nodes {
		if n.parent == "" {
			rootID = i
		}
	}
	fmt.Fprintf(b, "link busy %.1f%%\n", 100*busy)
	if ref[rootID].Alloc >= l.linkBps*0.9999 && busy < busyTol {
		viol = append(viol, fmt.Sprintf("link idle %.2f%% while demand covers it", 100*(1-busy)))
	}
	for i, n := range tr.nodes {
		if n.parent == "" {
			continue
		}
		port := tr.isPort(i)
		got := (s1[i] - s0[i]) * 8 / dt
		want := ref[i].Alloc
		rel := 0.0
		if want > 0 {
			rel = (got - want) / want
		}
		if port {
			worst = max(worst, math.Abs(rel))
		}
		if !portsOnly || port {
			dem := ""
			if port && !math.IsInf(demand[i], 1) {
				dem = " demand " + gbps(demand[i])
			}
			// Rounded so that a change of tie-breaking does not show.
			errPct := math.Round(1000*rel) / 10
			if errPct == 0 {
				errPct = 0 // no "-0.0"
			}
			fmt.Fprintf(b, "%s%-6s got %-10s want %-10s err %+.1f%% (%s)%s\n", strings.Repeat("  ", tr.depth(i)-1), n.name,
				gbps(got), gbps(want), errPct, ref[i].Reason, dem)
		}
		// A bursty port whose average demand is just above its share sits on
		// the boundary between share-bound and demand-bound: while its
		// siblings idle it may take more than its average share, so the
		// time average of its (correct) momentary allocations lies between
		// alloc's answer for the average demand and that demand.
		boundary := port && ref[i].Reason == alloc.ShareBound && !math.IsInf(demand[i], 1) &&
			demand[i] > want && demand[i] <= want*(1+boundaryTol)
		switch {
		case want == 0 && got > 0:
			viol = append(viol, fmt.Sprintf("%s got %s, entitled to nothing", n.name, fmtRate(got)))
		case boundary && (got < want*(1-relTol)-quantumBps || got > demand[i]*(1+relTol)+quantumBps):
			viol = append(viol, fmt.Sprintf("%s got %s, not between its share %s and its demand %s (± 1%% + one %d-byte packet)",
				n.name, gbps(got), gbps(want), gbps(demand[i]), maxPkt))
		case boundary:
			fmt.Fprintf(b, "note: %s's demand is within %.0f%% above its share: anything between them is its due\n", n.name, 100*boundaryTol)
		case math.Abs(got-want) > relTol*want+quantumBps:
			viol = append(viol, fmt.Sprintf("%s off its entitlement by %+.2f%% (tolerance %.0f%% + one %d-byte packet)", n.name, 100*rel, 100*relTol, maxPkt))
		}
		if lim := limitOrInf(params[i].LimitBps); got > lim*(1+limitTol) {
			viol = append(viol, fmt.Sprintf("%s exceeds its limit: %s > %s", n.name, fmtRate(got), fmtRate(lim)))
		}
	}
	if len(viol) == 0 {
		b.WriteString("invariants: ok\n")
	}
	for _, v := range viol {
		b.WriteString("VIOLATION: " + v + "\n")
	}
	return worst
}

// gbps prints a rate in Gbps to the Mbps.
func gbps(bps float64) string {
	return strconv.FormatFloat(bps/1e9, 'f', 3, 64) + "Gbps"
}
