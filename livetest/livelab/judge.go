package livelab

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"sluice/agent"
)

// Flow is one flow of a judged run, as Judge reads it: its receiver's
// iperf3 port, the second of the run in which it starts, and how many
// one-second intervals it has.
type Flow struct {
	Name   string
	Port   int
	StartS int
	N      int
}

// Judgement is what Judge makes of a run.
type Judgement struct {
	// Rates holds each flow's received rate (bits/s) per interval j,
	// second StartS+j of the run: from precisely timed samples where the
	// second is timed, else from the nearest samples (display only).
	Rates map[string][]float64
	// Short marks the seconds of the run that are not judged.
	Short []bool
	// Why a second was not judged: counts per reason.
	Starved, Untimed, Starting, Held, Thin int
	// Holds describes each hold of a receiver's bytes that set seconds
	// aside (evidence).
	Holds        []string
	Conservation Conservation
	// Evidence is what the machine and the receivers' reads did over the
	// run: shown whenever seconds were set aside.
	Evidence string
}

// MaxLate is the part of a second's payload that a receiver may get late
// (held back by TCP's repair of a loss) and the second still be judged:
// the receivers' per-second counts are this precise. No live test judges a
// single second tighter than 10%; means and medians move far less.
const MaxLate = 0.05

// payloadOf is the most TCP payload frames of sent bytes (as HTB counts
// them) carry: full segments.
func payloadOf(sent float64) float64 { return sent * agent.MaxPayloadBps(1e9) / 1e9 }

// Judge judges the seconds of a run that began when the class watch cw
// began (cw stopped) and whose receivers rw sampled. Second i counts (is
// judged) when:
//
//   - every watched port's class had packets waiting in MinBacklogged of
//     the class watch's samples over the measured window (the scheduler,
//     not a starved sender, set the rates);
//   - both ends of its window were timed (Receivers.Window);
//   - no delayed flow starts in it or in the second before (its first
//     interval is no full second of the link);
//   - no watched port's receiver held its bytes across one of its ends
//     (Receivers.Stall) while the port's class went on sending: TCP
//     repairing a lost segment holds what arrives after the hole, and
//     delivers it in the next second; the class's own counters show that
//     the scheduler did not stop (a class that stopped while backlogged
//     is the scheduler's, and is judged);
//   - no watched port's receiver got more in it than the port's class sent
//     over the class samples around it (as payload, plus MaxLate and
//     MaxInFlight): those bytes were held back from the second before,
//     which is set aside too;
//   - with usable > 0, all flows together carried MinCarried of usable.
//
// Seconds backlogged and timed but thin are the scheduler's: their share
// is the run's work conservation.
func Judge(cw *ClassWatch, rw *Receivers, flows []Flow, ports []string, usable float64, machine Load) Judgement {
	secs, start := cw.Stop(), cw.Start()
	n := 0
	for _, f := range flows {
		n = max(n, f.StartS+f.N)
	}
	j := Judgement{Rates: map[string][]float64{}, Short: make([]bool, n)}
	for _, f := range flows {
		j.Rates[f.Name] = make([]float64, f.N)
	}
	backlogged, sums := make([]bool, n), make([]float64, n)
	var late []int // seconds in which a receiver got more than its class sent
	for i := range n {
		a := start.Add(time.Duration(i) * time.Second)
		tw := rw.Window(a, a.Add(time.Second))
		sum := 0.0
		for _, f := range flows {
			k := i - f.StartS
			if k < 0 || k >= f.N {
				continue
			}
			r := 0.0
			if tw.OK() {
				r = rw.Between(f.Port, tw)
			} else {
				r, _ = rw.Rate(f.Port, a, a.Add(time.Second))
			}
			j.Rates[f.Name][k] = r
			sum += r
		}
		sums[i] = sum
		full := Backlogged(secs, i, ports)
		if tw.OK() {
			full = cw.BackloggedBetween(ports, tw.From, tw.To)
		}
		starting := false
		for _, f := range flows {
			starting = starting || (f.StartS > 0 && (i == f.StartS-1 || i == f.StartS))
		}
		held := false
		for _, f := range flows {
			if !slices.Contains(ports, f.Name) {
				continue
			}
			for _, at := range []time.Time{a, a.Add(time.Second)} {
				rate, ok := rw.Rate(f.Port, at.Add(-time.Second), at.Add(time.Second))
				if !ok || rate <= 0 {
					continue
				}
				from, to, stalled := rw.Stall(f.Port, at, rate)
				if !stalled {
					continue
				}
				sent, ok := cw.Sent(f.Name, from, to)
				if want := rate / 8 * to.Sub(from).Seconds(); ok && sent >= 0.5*want {
					held = true
					j.Holds = append(j.Holds, fmt.Sprintf("%s's receiver held its bytes for %v across %.1f s of the run while its class sent %.0f%% of its rate",
						f.Name, to.Sub(from).Round(time.Millisecond), at.Sub(start).Seconds(), 100*sent/want))
				}
			}
		}
		if tw.OK() {
			for _, f := range flows {
				if !slices.Contains(ports, f.Name) || i < f.StartS || i-f.StartS >= f.N {
					continue
				}
				got := j.Rates[f.Name][i-f.StartS] / 8 * tw.To.Sub(tw.From).Seconds()
				if sent, ok := cw.SentAround(f.Name, tw.From, tw.To); ok && got > payloadOf(sent)*(1+MaxLate)+MaxInFlight {
					late = append(late, i)
					j.Holds = append(j.Holds, fmt.Sprintf("%s's receiver got %.0f kB in second %d of the run where its class sent %.0f kB of payload at most: bytes held from the second before",
						f.Name, got/1e3, i, payloadOf(sent)/1e3))
				}
			}
		}
		backlogged[i] = full && tw.OK() && !starting && !held
		switch {
		case !full:
			j.Short[i] = true
			j.Starved++
		case !tw.OK():
			j.Short[i] = true
			j.Untimed++
		case starting:
			j.Short[i] = true
			j.Starting++
		case held:
			j.Short[i] = true
			j.Held++
		case usable > 0 && sum < MinCarried*usable:
			j.Short[i] = true
			j.Thin++
		}
	}
	// A second in which a receiver got more than its class sent got
	// bytes of the second before, held back (TCP repairing a loss in less
	// than MinStall): neither second's split is the scheduler's.
	for _, i := range late {
		for _, k := range []int{i - 1, i} {
			if k >= 0 && !j.Short[k] {
				j.Short[k] = true
				j.Held++
			}
			if k >= 0 {
				backlogged[k] = false
			}
		}
	}
	if usable > 0 {
		j.Conservation = Conserved(backlogged, sums, usable)
	}
	j.Evidence = fmt.Sprintf("%s; %s", rw.Reads(start, start.Add(time.Duration(n)*time.Second)), machine)
	return j
}

// Summary says how many seconds were judged and why the others were not,
// with the evidence when any was set aside.
func (j Judgement) Summary() string {
	judged := 0
	for _, s := range j.Short {
		if !s {
			judged++
		}
	}
	var why []string
	for _, c := range []struct {
		n    int
		what string
	}{{j.Starved, "a class not backlogged (its sender short of CPU)"}, {j.Untimed, "the receivers' samples at its ends not timed"},
		{j.Starting, "a delayed flow starting"}, {j.Held, "a receiver holding its bytes across an end (TCP repairing a loss) while its class kept sending"},
		{j.Thin, "backlogged classes carrying less than the full link"}} {
		if c.n > 0 {
			why = append(why, fmt.Sprintf("%d with %s", c.n, c.what))
		}
	}
	s := fmt.Sprintf("judged %d of %d seconds", judged, len(j.Short))
	if len(why) > 0 {
		s += "; not judged: " + strings.Join(why, ", ") + "; " + j.Evidence
	}
	if len(j.Holds) > 0 {
		s += "; " + strings.Join(slices.Compact(j.Holds), "; ")
	}
	return s
}
