package mclock

import (
	"fmt"
	"strings"
	"testing"
)

// runLag measures how a client that becomes busy is served relative to its
// entitlement: `lag capacity=U others=N [s=1] [late-r=0] [late-s=1] [late-l=0]
// start=D window=D [bytes=4KiB]`. N greedy clients with shares s keep the
// device busy from t=0; the late client is idle until start, then greedy. For
// every dispatch in [start, start+window] it computes
//
//	lead(x) = served_late(start, x) − entitlement·(x − start)
//
// (cost units) and prints the largest lead (a burst beyond the share) and
// the largest lag (a deficit). The stated bound for both is the one of
// start-time fair queueing, which the P tags implement: for any two
// backlogged clients i, j over any interval, |W_i/S_i − W_j/S_j| ≤
// c/S_i + c/S_j (c the largest request cost); summed over the n other
// clients this bounds the late client's lead and lag by
// c·(1 + n·S_late/S_total). An idle client thus earns no credit for its
// idle time and starts competing at once.
func runLag(a argMap) string {
	capacity := a.float("capacity", 1000)
	n := a.int("others", 4)
	start := a.dur("start", 10e9)
	window := a.dur("window", 5e9)
	size := a.bytes("bytes", 4096)
	var cs []simClient
	for range n {
		cs = append(cs, simClient{p: Params{Shares: a.float("s", 1)}, kind: "greedy", sizes: []int64{size}})
	}
	late := simClient{
		p:      Params{ReservationIOPS: a.float("late-r", 0), Shares: a.float("late-s", 1), LimitIOPS: a.float("late-l", 0)},
		kind:   "greedy",
		sizes:  []int64{size},
		startN: start,
	}
	cs = append(cs, late)
	li := len(cs) - 1
	// Entitlement with everybody busy.
	ent := entitlements(capacity, 1e9, cs, simResult{arrived: make([]float64, len(cs))})[li]
	var served float64
	lead, lag := 0.0, 0.0
	var first int64 = -1
	simulate(Config{}, capacity, start+window, cs, 7, func(now int64, id int, cost int64) {
		if now < start {
			return
		}
		if id == li {
			if first < 0 {
				first = now
			}
			served += float64(cost)
		}
		// Before and after the dispatch: the lead peaks just after one,
		// the lag just before one.
		due := ent * float64(now-start) / 1e9
		lag = max(lag, due-(served-float64(cost)*b2f(id == li)))
		lead = max(lead, served-due)
	})
	cost := float64(New(Config{}).Cost(size))
	var b strings.Builder
	fmt.Fprintf(&b, "late client entitled %.1f units/s; first served %.3fms after start; served %.0f units in %s\n",
		ent, float64(first-start)/1e6, served, fmtNs(window))
	total := late.p.Shares + float64(n)*a.float("s", 1)
	bound := 1 + float64(n)*late.p.Shares/total
	fmt.Fprintf(&b, "max lead %.2f requests, max lag %.2f requests (bound %.2f)\n", lead/cost, lag/cost, bound)
	if lead > bound*cost {
		b.WriteString("violation: burst beyond share exceeds the bound\n")
	}
	if lag > bound*cost {
		b.WriteString("violation: deficit exceeds the bound\n")
	}
	return b.String()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestLimitWindow checks the limit bound of Config.LimitBurstNs: over any
// window of W a client receives at most LimitIOPS·(W + LimitBurstNs) plus
// two requests, here for a limited greedy client (2048 units/s, 64 KiB
// requests) against a bursty client with 7× its shares, so that it is
// often held below its limit and then catches up.
func TestLimitWindow(t *testing.T) {
	const limit = 2048.0
	cs := []simClient{
		{name: "bursty", p: Params{Shares: 3641}, kind: "burst", rate: 529.3, burst: 23, sizes: []int64{4 << 10, 16 << 10, 64 << 10, 256 << 10}},
		{name: "limited", p: Params{ReservationIOPS: 1261, Shares: 540, LimitIOPS: limit}, kind: "greedy", sizes: []int64{64 << 10}},
	}
	var served float64
	minSlack := 0.0 // min over dispatch times of served-before − limit·t
	worst := 0.0
	res := simulate(Config{}, 5000, 100e9, cs, 1, func(now int64, id int, cost int64) {
		if id != 1 {
			return
		}
		tSec := float64(now) / 1e9
		minSlack = min(minSlack, served-limit*tSec)
		served += float64(cost)
		worst = max(worst, served-limit*tSec-minSlack)
	})
	bound := limit*float64(DefaultLimitBurstNs)/1e9 + 2*2 // + two 64 KiB requests
	t.Logf("limited client: %.1f units/s; largest excess over limit·W: %.1f units (bound %.1f)", res.served[1]/100, worst, bound)
	if worst > bound {
		t.Errorf("limited client exceeded limit·(W + LimitBurstNs) + 2 requests: %.1f > %.1f units", worst, bound)
	}
	if got := res.served[1] / 100; got < 0.98*limit {
		t.Errorf("limited client got %.1f units/s, want its limit %g within 2%%", got, limit)
	}
}
