package hclock

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

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
