package hclock

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"sluice/alloc"
)

// This file is the test harness: a tree description parsed from text, a
// link model that drains the scheduler at a fixed rate, traffic sources,
// and the comparison with alloc.Compute (the reference entitlements).

// tnode is one node of a test tree.
type tnode struct {
	name   string
	parent string
	p      Params
	q, qb  int
}

type ttree struct {
	nodes []tnode
	idx   map[string]int
}

func (t *ttree) config() Config {
	cfg := Config{}
	for i, n := range t.nodes {
		par := -1
		if n.parent != "" {
			par = t.idx[n.parent]
		}
		cfg.Nodes = append(cfg.Nodes, NodeConfig{ID: i, Parent: par, Name: n.name, Params: n.p, QueuePackets: n.q, QueueBytes: n.qb})
	}
	return cfg
}

func (t *ttree) children(name string) []int {
	var out []int
	for i, n := range t.nodes {
		if n.parent == name {
			out = append(out, i)
		}
	}
	return out
}

func (t *ttree) isPort(i int) bool { return len(t.children(t.nodes[i].name)) == 0 }

func (t *ttree) depth(i int) int {
	d := 0
	for n := t.nodes[i]; n.parent != ""; n = t.nodes[t.idx[n.parent]] {
		d++
	}
	return d
}

// parseRate reads 9.4Gbps, 500Mbps, 10Kbps, 1000bps or unlimited.
func parseRate(s string) (float64, error) {
	if s == "unlimited" || s == "inf" {
		return math.Inf(1), nil
	}
	mult := 1.0
	for _, u := range []struct {
		suf string
		m   float64
	}{{"Gbps", 1e9}, {"Mbps", 1e6}, {"Kbps", 1e3}, {"bps", 1}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("bad rate %q", s)
	}
	return v * mult, nil
}

// parseDur reads 10ms, 5us, 2s, 100ns.
func parseDur(s string) (int64, error) {
	if s == "0" {
		return 0, nil
	}
	for _, u := range []struct {
		suf string
		m   float64
	}{{"ms", 1e6}, {"us", 1e3}, {"ns", 1}, {"s", 1e9}} {
		if strings.HasSuffix(s, u.suf) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suf), 64)
			if err != nil {
				return 0, fmt.Errorf("bad duration %q", s)
			}
			return int64(v * u.m), nil
		}
	}
	return 0, fmt.Errorf("bad duration %q (want a unit: ns, us, ms, s)", s)
}

func fmtRate(bps float64) string {
	switch {
	case math.IsInf(bps, 1):
		return "unlimited"
	case bps == 0:
		return "0"
	case bps >= 1e9:
		return strconv.FormatFloat(bps/1e9, 'f', 3, 64) + "Gbps"
	case bps >= 1e6:
		return strconv.FormatFloat(bps/1e6, 'f', 2, 64) + "Mbps"
	default:
		return strconv.FormatFloat(bps/1e3, 'f', 1, 64) + "Kbps"
	}
}

// kv parses "k=v" words into a map; bare words go into the "" key list.
func kv(words []string) (map[string]string, []string) {
	m := map[string]string{}
	var bare []string
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		} else {
			bare = append(bare, w)
		}
	}
	return m, bare
}

// parseTree reads one node per line: NAME [parent=P] [r=RATE] [s=N] [l=RATE] [q=N] [qbytes=N].
func parseTree(text string) (*ttree, error) {
	t := &ttree{idx: map[string]int{}}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n := tnode{name: f[0], p: Params{Shares: 50}}
		m, _ := kv(f[1:])
		var err error
		for k, v := range m {
			switch k {
			case "parent":
				n.parent = v
			case "r":
				n.p.ReservationBps, err = parseRate(v)
			case "l":
				n.p.LimitBps, err = parseRate(v)
			case "s":
				n.p.Shares, err = strconv.ParseFloat(v, 64)
			case "q":
				n.q, err = strconv.Atoi(v)
			case "qbytes":
				n.qb, err = strconv.Atoi(v)
			default:
				err = fmt.Errorf("unknown field %q", k)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %v", n.name, err)
			}
		}
		if _, dup := t.idx[n.name]; dup {
			return nil, fmt.Errorf("%s: defined twice", n.name)
		}
		t.idx[n.name] = len(t.nodes)
		t.nodes = append(t.nodes, n)
	}
	for _, n := range t.nodes {
		if _, ok := t.idx[n.parent]; n.parent != "" && !ok {
			return nil, fmt.Errorf("%s: unknown parent %q", n.name, n.parent)
		}
	}
	return t, nil
}

// source is the traffic of one port.
type source struct {
	port    int
	greedy  bool    // keeps the queue full
	rateBps float64 // mean offered rate for bursty sources
	burst   int     // mean packets per burst
	size    int     // bytes; 0 means a mix of 64, 1500 and 65536
	startNs int64
	watchNs int64 // lag: bursts are measured from here
	nextNs  int64
	started bool
}

func (src *source) pktSize(rng *rand.Rand) int {
	if src.size > 0 {
		return src.size
	}
	// A mix: mostly MTU packets, some small ones, some 64 KB GSO segments.
	switch r := rng.IntN(100); {
	case r < 20:
		return 64
	case r < 95:
		return 1500
	default:
		return 65536
	}
}

// event changes a node's params at a time.
type event struct {
	atNs int64
	node int
	p    Params
}

// win is what one port (or node) did in a measurement window.
type win struct {
	sentBytes     float64
	acceptedBytes float64
}

// linkSim drains a scheduler at linkBps.
type linkSim struct {
	t       *ttree
	s       *Scheduler
	linkBps float64
	nowNs   int64
	rng     *rand.Rand
	srcs    []*source
	bySrc   map[int]*source
	sent    []float64 // cumulative bytes sent per node
	acc     []float64 // cumulative bytes accepted per port
	packets int
	busyNs  int64
	fracNs  float64 // fraction of a ns of wire time carried over
	// onSend, when set, is called after each packet with the time the
	// packet finished.
	onSend func(p Packet, endNs int64)
}

func newLinkSim(t *ttree, linkBps float64, seed uint64) (*linkSim, error) {
	s, err := New(t.config())
	if err != nil {
		return nil, err
	}
	return &linkSim{
		t: t, s: s, linkBps: linkBps,
		rng:   rand.New(rand.NewPCG(seed, 0x5eed)),
		bySrc: map[int]*source{},
		sent:  make([]float64, len(t.nodes)),
		acc:   make([]float64, len(t.nodes)),
	}, nil
}

func (l *linkSim) add(src *source) {
	src.nextNs = src.startNs
	l.srcs = append(l.srcs, src)
	l.bySrc[src.port] = src
}

func (l *linkSim) enqueue(src *source, now int64) bool {
	b := src.pktSize(l.rng)
	if l.s.Enqueue(src.port, b, now) {
		l.acc[src.port] += float64(b)
		return true
	}
	return false
}

// arrivals delivers what sources offer up to now and returns the next
// arrival time.
func (l *linkSim) arrivals() int64 {
	next := Never
	for _, src := range l.srcs {
		if src.greedy {
			if !src.started && src.startNs <= l.nowNs {
				src.started = true
				for l.enqueue(src, l.nowNs) {
				}
			}
			if !src.started {
				next = min(next, src.startNs)
			}
			continue
		}
		for src.nextNs <= l.nowNs {
			k := 1 + l.rng.IntN(2*src.burst-1)
			bytes := 0
			for range k {
				b := src.pktSize(l.rng)
				bytes += b
				if l.s.Enqueue(src.port, b, src.nextNs) {
					l.acc[src.port] += float64(b)
				}
			}
			gap := float64(bytes) * 8e9 / src.rateBps * l.rng.ExpFloat64()
			src.nextNs += int64(gap) + 1
		}
		next = min(next, src.nextNs)
	}
	return next
}

// step sends one packet or advances time to the next event; it returns
// false when nothing will ever happen again.
func (l *linkSim) step(until int64) bool {
	nextArr := l.arrivals()
	p, ok, next := l.s.Dequeue(l.nowNs)
	if !ok {
		t := min(next, nextArr, until)
		if t == Never {
			return false
		}
		if t <= l.nowNs {
			t = l.nowNs + 1
		}
		l.nowNs = t
		return true
	}
	// Wire time, carrying the fraction of a ns so that rates are exact.
	w := float64(p.Bytes)*8e9/l.linkBps + l.fracNs
	wire := int64(w)
	l.fracNs = w - float64(wire)
	start := l.nowNs
	l.nowNs += wire
	l.busyNs += wire
	l.packets++
	for id := p.Port; id >= 0; id = l.s.cfg.Nodes[id].Parent {
		l.sent[id] += float64(p.Bytes)
	}
	if src := l.bySrc[p.Port]; src != nil && src.greedy {
		l.enqueue(src, start)
	}
	if l.onSend != nil {
		l.onSend(p, l.nowNs)
	}
	return true
}

// snapshot copies the cumulative counters.
func (l *linkSim) snapshot() (sent, acc []float64, nowNs, busyNs int64) {
	return append([]float64(nil), l.sent...), append([]float64(nil), l.acc...), l.nowNs, l.busyNs
}

// reference computes alloc's entitlements for the tree with the given
// port demands (bits/s; Inf for greedy).
func reference(t *ttree, params []Params, demand []float64, capacity float64) []*alloc.Node {
	an := make([]*alloc.Node, len(t.nodes))
	for i, n := range t.nodes {
		p := params[i]
		l := p.LimitBps
		if unlimited(l) {
			l = alloc.Inf
		}
		an[i] = &alloc.Node{Name: n.name, Reservation: p.ReservationBps, Shares: p.Shares, Limit: l, Demand: demand[i], Semantics: alloc.Additive}
	}
	root := 0
	for i, n := range t.nodes {
		if n.parent == "" {
			root = i
			continue
		}
		pa := an[t.idx[n.parent]]
		pa.Children = append(pa.Children, an[i])
	}
	alloc.Compute(an[root], capacity)
	return an
}
