package hclock

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
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
		switch {
		case want == 0 && got > 0:
			viol = append(viol, fmt.Sprintf("%s got %s, entitled to nothing", n.name, fmtRate(got)))
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

// randomCmd builds a random tree that obeys the admission rules of
// DESIGN.md §2 (class reservations ≤ 75% of the link, port reservations ≤
// their class's, R ≤ L) and runs it.
func randomCmd(t *testing.T, cmdArgs []datadriven.CmdArg) string {
	a := args(cmdArgs)
	seed, _ := strconv.Atoi(a["seed"])
	classes, _ := strconv.Atoi(a["classes"])
	ports, _ := strconv.Atoi(a["ports"])
	pk, _ := strconv.ParseFloat(a["packets"], 64)
	rng := rand.New(rand.NewPCG(uint64(seed), 42))
	// Limits only with greedy demand. alloc is given each port's average
	// demand; that is the scheduler's long-run answer as long as the set of
	// binding constraints does not change as bursty ports come and go.
	// Shares and reservations are linear, so it does not; a limit can bind
	// while a bursty port is idle and not while it is busy, and then the
	// time average of the (correct) instantaneous allocations differs from
	// the allocation of the average demand. limits.txt tests limits.
	withLimits := a["demand"] == "greedy"
	const linkBps = 10e9
	shares := func() float64 {
		if rng.IntN(2) == 0 {
			return []float64{25, 50, 100}[rng.IntN(3)]
		}
		return float64(1 + rng.IntN(200))
	}
	tr := &ttree{idx: map[string]int{}}
	add := func(n tnode) {
		tr.idx[n.name] = len(tr.nodes)
		tr.nodes = append(tr.nodes, n)
	}
	add(tnode{name: "up", p: Params{}})
	resv := splitRandom(rng, classes, 0.75*linkBps*rng.Float64())
	var srcs []*source
	size := 1500
	if a["size"] == "mix" {
		size = 0
	}
	for c := range classes {
		cn := tnode{name: fmt.Sprintf("c%d", c), parent: "up", p: Params{ReservationBps: resv[c], Shares: shares()}}
		if rng.IntN(4) == 0 && withLimits {
			cn.p.LimitBps = resv[c] + (linkBps-resv[c])*(0.1+0.9*rng.Float64())
		}
		add(cn)
		np := 1 + rng.IntN(ports)
		pr := splitRandom(rng, np, resv[c]*rng.Float64())
		for p := range np {
			pn := tnode{name: fmt.Sprintf("c%dp%d", c, p), parent: cn.name, p: Params{ReservationBps: pr[p], Shares: shares()}, q: 64, qb: 256 << 10}
			if rng.IntN(4) == 0 && withLimits {
				pn.p.LimitBps = pr[p] + 0.02*linkBps + 0.5*linkBps*rng.Float64()
			}
			add(pn)
			src := &source{port: tr.idx[pn.name], size: size, burst: 8}
			switch a["demand"] {
			case "greedy":
				src.greedy = true
			case "bursty":
				src.rateBps = linkBps * (0.01 + 0.3*rng.Float64())
			case "mixed":
				if rng.IntN(2) == 0 {
					src.greedy = true
				} else {
					src.rateBps = linkBps * (0.01 + 0.3*rng.Float64())
				}
			default:
				t.Fatalf("demand=%q", a["demand"])
			}
			srcs = append(srcs, src)
		}
	}
	o := runOpts{linkBps: linkBps, packets: int(pk), seed: uint64(seed), warmup: 0.1}
	out, worst := simulate(t, tr, o, srcs, nil, false)
	return describe(tr) + out + fmt.Sprintf("largest port error %.1f%%\n", 100*worst)
}

// splitRandom splits total into n random non-negative parts (some zero).
func splitRandom(rng *rand.Rand, n int, total float64) []float64 {
	w := make([]float64, n)
	sum := 0.0
	for i := range w {
		if rng.IntN(3) > 0 {
			w[i] = rng.Float64()
			sum += w[i]
		}
	}
	for i := range w {
		if sum > 0 {
			w[i] = w[i] / sum * total
		}
	}
	return w
}

// LagBoundPackets is the stated burst bound, in largest packets: a port
// that becomes busy receives, over any interval [t0, t] from the moment it
// becomes busy, at most its entitlement × (t−t0) plus this many packets of
// the largest size in the system (see docs/hclock.md).
const LagBoundPackets = 2

// lagCmd measures, for every port that starts late, the largest burst
// beyond its entitlement from the moment it becomes busy.
func lagCmd(t *testing.T, tr *ttree, cmdArgs []datadriven.CmdArg, input string) string {
	a := args(cmdArgs)
	o := parseRunOpts(t, a)
	srcs, evs := parseSources(t, tr, input)
	if len(evs) > 1 {
		t.Fatal("lag takes at most one event")
	}
	l, err := newLinkSim(tr, o.linkBps, o.seed)
	if err != nil {
		t.Fatal(err)
	}
	params := make([]Params, len(tr.nodes))
	demand := make([]float64, len(tr.nodes))
	for i, n := range tr.nodes {
		params[i] = n.p
	}
	// With an event, the ports below the changed node are watched from the
	// event on, against the entitlements after it.
	var evNs int64
	watched := map[int]bool{}
	for _, e := range evs {
		evNs = e.atNs
		params[e.node] = merge(params[e.node], e.p)
		for _, s := range srcs {
			for y := s.port; y >= 0; y = l.s.cfg.Nodes[y].Parent {
				if y == e.node {
					watched[s.port] = true
				}
			}
		}
	}
	maxPkt := 0
	for _, s := range srcs {
		l.add(s)
		if !s.greedy {
			t.Fatal("lag: sources must be greedy")
		}
		demand[s.port] = math.Inf(1)
		if s.size == 0 {
			maxPkt = max(maxPkt, 65536)
		} else {
			maxPkt = max(maxPkt, s.size)
		}
	}
	ref := reference(tr, params, demand, o.linkBps)
	type track struct {
		src             *source
		wantBps         float64
		sent            float64
		excess, deficit float64
	}
	var tracks []*track
	byPort := map[int]*track{}
	for _, s := range srcs {
		if s.startNs > 0 || watched[s.port] {
			if watched[s.port] {
				s.watchNs = evNs
			} else {
				s.watchNs = s.startNs
			}
			k := &track{src: s, wantBps: ref[s.port].Alloc}
			tracks = append(tracks, k)
			byPort[s.port] = k
		}
	}
	l.onSend = func(p Packet, endNs int64) {
		k := byPort[p.Port]
		if k == nil {
			// Deficit of the others is seen at their own sends; also
			// sample the late starters' deficit here.
			for _, k := range tracks {
				if endNs > k.src.watchNs {
					k.deficit = max(k.deficit, k.wantBps/8*float64(endNs-k.src.watchNs)/1e9-k.sent)
				}
			}
			return
		}
		startNs := endNs - int64(math.Round(float64(p.Bytes)*8e9/o.linkBps))
		if startNs < k.src.watchNs {
			return
		}
		k.sent += float64(p.Bytes)
		// Counted when sending starts: the whole packet is charged then.
		k.excess = max(k.excess, k.sent-k.wantBps/8*float64(startNs-k.src.watchNs)/1e9)
	}
	var b strings.Builder
	for _, e := range evs {
		for l.nowNs < e.atNs && l.step(e.atNs) {
		}
		if err := l.s.SetParams(e.node, params[e.node], l.nowNs); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "at %s: set %s r=%s s=%g l=%s\n", fmtDur(e.atNs), tr.nodes[e.node].name,
			fmtRate(params[e.node].ReservationBps), params[e.node].Shares, fmtRate(limitOrInf(params[e.node].LimitBps)))
	}
	for l.nowNs < o.durNs && l.step(o.durNs) {
	}
	bound := float64(LagBoundPackets * maxPkt)
	if len(evs) > 0 {
		// Released from a limit while backlogged: what it was owed while
		// held counts too, up to MaxCreditBytes of reservation and of
		// shares.
		bound += 2 * DefaultMaxCreditBytes
		fmt.Fprintf(&b, "largest packet %d bytes; bound %d packets + 2 × %d bytes credit = %.0f bytes\n", maxPkt, LagBoundPackets, DefaultMaxCreditBytes, bound)
	} else {
		fmt.Fprintf(&b, "largest packet %d bytes; bound %d packets = %.0f bytes\n", maxPkt, LagBoundPackets, bound)
	}
	for _, k := range tracks {
		name := tr.nodes[k.src.port].name
		fmt.Fprintf(&b, "%s: watched from %s, entitled to %s: largest burst beyond it %.0f bytes (%.2f packets), largest shortfall %.0f bytes\n",
			name, fmtDur(k.src.watchNs), fmtRate(k.wantBps), k.excess, k.excess/float64(maxPkt), k.deficit)
		if k.excess > bound {
			fmt.Fprintf(&b, "VIOLATION: %s burst %.0f bytes > bound %.0f bytes\n", name, k.excess, bound)
		}
	}
	return b.String()
}

// opsCmd drives the API directly and prints what each call returned.
func opsCmd(t *testing.T, tr *ttree, input string) string {
	s, err := New(tr.config())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		var at int64
		if last := f[len(f)-1]; strings.HasPrefix(last, "@") {
			if at, err = parseDur(last[1:]); err != nil {
				t.Fatal(err)
			}
			f = f[:len(f)-1]
		}
		id := func(name string) int {
			i, ok := tr.idx[name]
			if !ok {
				return -1
			}
			return i
		}
		fmt.Fprintf(&b, "%s -> ", line)
		switch f[0] {
		case "enqueue":
			n, _ := strconv.Atoi(f[2])
			fmt.Fprintf(&b, "%v\n", s.Enqueue(id(f[1]), n, at))
		case "dequeue":
			p, ok, next := s.Dequeue(at)
			switch {
			case ok:
				fmt.Fprintf(&b, "%s %dB (queued at %s)\n", s.Name(p.Port), p.Bytes, fmtDur(p.EnqueuedNs))
			case next == Never:
				b.WriteString("nothing queued\n")
			default:
				fmt.Fprintf(&b, "nothing until %s\n", fmtDur(next))
			}
		case "set":
			m, _ := kv(f[2:])
			err := s.SetParams(id(f[1]), merge(s.Params(id(f[1])), setParams(t, Params{}, m)), at)
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
			} else {
				b.WriteString("ok\n")
			}
		case "stats":
			st := s.Stats(id(f[1]))
			fmt.Fprintf(&b, "sent %d pkts %dB (by reservation %dB), dropped %d pkts %dB, queued %d pkts %dB\n",
				st.SentPackets, st.SentBytes, st.ReservationBytes, st.DroppedPackets, st.DroppedBytes, st.QueuedPackets, st.QueuedBytes)
		default:
			t.Fatalf("unknown op %q", f[0])
		}
	}
	return b.String()
}

// gbps prints a rate in Gbps to the Mbps.
func gbps(bps float64) string {
	return strconv.FormatFloat(bps/1e9, 'f', 3, 64) + "Gbps"
}
