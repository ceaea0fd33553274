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
// one-second intervals it has. Running says it was sending before that
// second (a flow judged from a later second of the watch on): its first
// interval is no start.
type Flow struct {
	Name    string
	Port    int
	StartS  int
	N       int
	Running bool
}

// Judgement is what Judge makes of a run.
type Judgement struct {
	// Rates holds each flow's received rate (bits/s) per interval j,
	// second StartS+j of the run: from precisely timed samples where the
	// second is timed, else from the nearest samples (display only).
	Rates map[string][]float64
	// Short marks the seconds of the run that are not judged.
	Short []bool
	// Late marks, per flow and interval, the judged seconds whose count is
	// displaced: the flow's receiver got more in it than its class sent
	// in it (ClassWatch.SentIn, as payload, plus MaxLate and MaxInFlight),
	// bytes held back from the second before (TCP repairing a loss faster
	// than MinStall), so both are marked; or, in the flow's last second,
	// less than its class sent by as much (bytes held past the run's end).
	// A test that judges single seconds of a flow judges a marked pair by
	// its mean, and a marked second whose partner lies outside the seconds
	// it judges by Sent; sums and medians over seconds barely move.
	Late map[string][]bool
	// Sent holds each flow's payload rate (bits/s) per interval as its
	// class's counters tell it (the most that full segments carry), over
	// the same timed window as Rates; 0 where the second is not timed.
	Sent map[string][]float64
	// Lates describes each displaced count (evidence).
	Lates []string
	// Why a second was not judged: counts per reason.
	Starved, Untimed, Absent, Starting, Held, Busy, Thin int
	// BusySeconds describe the thin seconds set aside for a busy machine.
	BusySeconds []string
	// Holds describes each hold of a receiver's bytes that set seconds
	// aside (evidence).
	Holds        []string
	Conservation Conservation
	// Evidence is what the machine and the receivers' reads did over the
	// run: shown whenever seconds were set aside.
	Evidence string
}

// MaxMachineWait is the share of a second in which some task may wait for
// a CPU (PSI cpu some) and a thin second still count against the
// scheduler's work conservation. Quiet runs of the lab's tests measured
// 2–3% over whole runs (2026-11-26); with QEMU guests of another test
// running unniced, 18–36%, and HTB then left a link with backlogged
// classes at 80–95% in most seconds.
const MaxMachineWait = 0.10

// MaxMachineSteal is how much CPU (in cores) the hypervisor under this
// machine may take from it in a second (steal) and a thin second still
// count against the scheduler's work conservation. Quiet runs measured
// 0.00–0.01; a make test run of 2026-11-27 had 0.46–0.52 over whole
// tests while links with backlogged classes carried 96% (PSI 6–7%:
// stolen time is no run-queue wait).
const MaxMachineSteal = 0.05

// Busy tells whether the machine may have thinned a second of backlogged
// classes: some task waited for a CPU more than MaxMachineWait of it, or
// the hypervisor stole more than MaxMachineSteal.
func (l Load) Busy() bool { return l.WaitShare > MaxMachineWait || l.StealCores > MaxMachineSteal }

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
//   - every watched port's flow has an interval in it: a flow whose
//     count ended before the others' (its client's run ended sooner) may
//     still have been sending, and the sum would miss it;
//   - no delayed flow starts in it or in the second before (its first
//     interval is no full second of the link), and no flow ends in it or
//     in the second before before the run ends (the others' TCP takes
//     over what it leaves within a second or two: seen in Exp. 1, where
//     the twelve VMs stayed at 52 Mbps each for the second after the NFS
//     and vMotion flows ended);
//   - no watched port's receiver held its bytes across one of its ends
//     (Receivers.Stall) while the port's class went on sending: TCP
//     repairing a lost segment holds what arrives after the hole, and
//     delivers it in the next second; the class's own counters show that
//     the scheduler did not stop (a class that stopped while backlogged
//     is the scheduler's, and is judged);
//   - with usable > 0, all flows together carried MinCarried of usable.
//
// A flow's count displaced between two seconds is marked in Late, and
// neither second counts in the work conservation (their sums are
// displaced too).
// Seconds backlogged and timed but thin are the scheduler's (unless some
// task waited for a CPU more than MaxMachineWait of the second, or the
// hypervisor stole more than MaxMachineSteal: the machine's, set aside
// with that evidence): their share is the run's work
// conservation.
func Judge(cw *ClassWatch, rw *Receivers, flows []Flow, ports []string, usable float64, machine *MachineWatch) Judgement {
	secs, start := cw.Stop(), cw.Start()
	n := 0
	for _, f := range flows {
		n = max(n, f.StartS+f.N)
	}
	j := Judgement{Rates: map[string][]float64{}, Late: map[string][]bool{}, Sent: map[string][]float64{}, Short: make([]bool, n)}
	for _, f := range flows {
		j.Rates[f.Name] = make([]float64, f.N)
		j.Sent[f.Name] = make([]float64, f.N)
		j.Late[f.Name] = make([]bool, f.N)
	}
	backlogged, sums := make([]bool, n), make([]float64, n)
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
		starting, absent := false, false
		for _, f := range flows {
			end := f.StartS + f.N
			starting = starting || (f.StartS > 0 && !f.Running && (i == f.StartS-1 || i == f.StartS)) ||
				(end < n && (i == end-1 || i == end))
			absent = absent || slices.Contains(ports, f.Name) && (i < f.StartS || i >= end)
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
				k := i - f.StartS
				if !slices.Contains(ports, f.Name) || k < 0 || k >= f.N {
					continue
				}
				from, to := rw.Ends(f.Port, tw) // its own namespace's samples
				sent, ok := cw.SentIn(f.Name, from, to)
				if !ok {
					continue
				}
				secs := to.Sub(from).Seconds()
				j.Sent[f.Name][k] = 8 * payloadOf(sent) / secs
				got := j.Rates[f.Name][k] / 8 * secs
				var pair [2]int
				switch {
				case got > payloadOf(sent)*(1+MaxLate)+MaxInFlight:
					pair = [2]int{k - 1, k}
				case k == f.N-1 && got < payloadOf(sent)*(1-MaxLate)-MaxInFlight:
					// The flow's last second: what it held back arrives
					// after the run, where no count shows it. Earlier, the
					// next second's surplus shows it (the case above); a
					// shortfall never made up is a loss, and is judged.
					pair = [2]int{k, k + 1}
				default:
					continue
				}
				for _, m := range pair {
					if m >= 0 && m < f.N {
						j.Late[f.Name][m] = true
					}
				}
				j.Lates = append(j.Lates, fmt.Sprintf("%s's receiver got %.0f kB in second %d of the run where its class sent %.0f kB of payload",
					f.Name, got/1e3, i, payloadOf(sent)/1e3))
			}
		}
		backlogged[i] = full && tw.OK() && !absent && !starting && !held
		switch {
		case !full:
			j.Short[i] = true
			j.Starved++
		case !tw.OK():
			j.Short[i] = true
			j.Untimed++
		case absent:
			j.Short[i] = true
			j.Absent++
		case starting:
			j.Short[i] = true
			j.Starting++
		case held:
			j.Short[i] = true
			j.Held++
		case usable > 0 && sum < MinCarried*usable:
			j.Short[i] = true
			if l := machine.Between(tw.From, tw.To); l.Busy() {
				// HTB's dequeue and the veths' softirqs wait for a CPU
				// like any task, and stop while the hypervisor runs
				// another guest on this one's CPUs: the machine's second,
				// not the scheduler's.
				backlogged[i] = false
				j.Busy++
				j.BusySeconds = append(j.BusySeconds, fmt.Sprintf("second %d carried %.0f%% (some task waited for a CPU %.0f%% of it, the hypervisor stole %.2f cores)", i, 100*sum/usable, 100*max(l.WaitShare, 0), l.StealCores))
			} else {
				j.Thin++
			}
		}
	}
	// A second with a displaced count has a displaced sum (the late bytes
	// belong to the second before): it says nothing about whether the
	// link was full, either way.
	for _, f := range flows {
		for k, late := range j.Late[f.Name] {
			if i := f.StartS + k; late && i < n {
				backlogged[i] = false
			}
		}
	}
	if usable > 0 {
		j.Conservation = Conserved(backlogged, sums, usable)
	}
	end := start.Add(time.Duration(n) * time.Second)
	j.Evidence = fmt.Sprintf("%s; %s", rw.Reads(start, end), machine.Between(start, end))
	if len(j.BusySeconds) > 0 {
		j.Evidence += "; " + strings.Join(j.BusySeconds, ", ")
	}
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
		{j.Absent, "a watched flow's count not covering it (its flow ended before the others' or had not begun)"},
		{j.Starting, "a delayed flow starting or a flow ending before the others"}, {j.Held, "a receiver holding its bytes across an end (TCP repairing a loss) while its class kept sending"},
		{j.Busy, fmt.Sprintf("backlogged classes carrying less than the full link while tasks waited for a CPU more than %.0f%% of the second or the hypervisor stole more than %.2f cores", 100*MaxMachineWait, MaxMachineSteal)},
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
	if len(j.Lates) > 0 {
		s += fmt.Sprintf("; %d counts displaced between seconds by their receivers (marked late: single-second checks judge the pair by its mean): %s", len(j.Lates), strings.Join(j.Lates, "; "))
	}
	return s
}
