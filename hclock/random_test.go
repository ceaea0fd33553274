package hclock

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/cockroachdb/datadriven"
)

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
