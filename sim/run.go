package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"sluice/policy"
)

// RunResult is one finished run.
type RunResult struct {
	Name   string
	sim    *Sim
	Events uint64 // events fired
	Log    []string
}

// Outcome is one evaluated expectation.
type Outcome struct {
	Name     string  `json:"name"`
	Run      string  `json:"run"`
	Metric   string  `json:"metric"`
	Of       string  `json:"of"`
	Window   string  `json:"window"`
	Measured float64 `json:"measured"`
	Expected string  `json:"expected"`
	Unit     string  `json:"unit"`
	Seed     string  `json:"seed,omitempty"`
	// Verdict compares with the seed: "beats the seed", "meets the
	// seed", "short of the seed", "beyond the sanity bound" (control
	// outcomes), "calibration difference" (a missed baseline figure).
	Verdict string `json:"verdict,omitempty"`
	Pass    bool   `json:"pass"`
	Error   string `json:"error,omitempty"`
	// Source is "sim" (measured in the simulator) or "live" (a live
	// measurement: kind: live); How says with which calibration, or by
	// which live measurement.
	Source string `json:"source"`
	How    string `json:"how,omitempty"`
	// Pending marks a live expectation without its live measurement: not
	// judged, neither met nor missed.
	Pending bool `json:"pending,omitempty"`
}

// Summary is the result of a scenario.
type Summary struct {
	Scenario string       `json:"scenario"`
	Seed     uint64       `json:"seed"`
	Duration float64      `json:"duration_s"`
	Runs     []RunSummary `json:"runs"`
	Expect   []Outcome    `json:"expectations"`
	Passed   bool         `json:"passed"`
}

// RunSummary lists what happened in one run.
type RunSummary struct {
	Name   string   `json:"name"`
	Events uint64   `json:"events"`
	Log    []string `json:"log"`
}

// Result is everything a scenario produced.
type Result struct {
	Scenario *Scenario
	Runs     []*RunResult
	Summary  Summary
}

// Run runs every run of the scenario and evaluates its expectations.
func Run(sc *Scenario) (*Result, error) {
	res := &Result{Scenario: sc}
	for _, run := range sc.Runs {
		s, err := newSim(sc, run)
		if err != nil {
			return nil, err
		}
		without := map[string]bool{}
		for _, w := range run.Without {
			if s.loads[w] == nil {
				return nil, lineErr(sc.file, run.Line, "without", "unknown workload %q", w)
			}
			without[w] = true
		}
		for _, wl := range s.loadList {
			if without[wl.spec.Name] || wl.spec.Start == "never" {
				continue
			}
			at, err := durNs(wl.spec.Start, 0)
			if err != nil {
				return nil, lineErr(sc.file, wl.spec.Line, "start", "%v", err)
			}
			w := wl
			s.eng.At(at, func() { s.startLoad(w) })
			if wl.spec.Stop != "" {
				st, err := durNs(wl.spec.Stop, 0)
				if err != nil {
					return nil, lineErr(sc.file, wl.spec.Line, "stop", "%v", err)
				}
				s.eng.At(st, func() { s.stopLoad(w) })
			}
		}
		for _, ev := range append(append([]EventSpec(nil), sc.Timeline...), run.Events...) {
			if (ev.Start != "" && without[ev.Start]) || (ev.Stop != "" && without[ev.Stop]) {
				continue
			}
			if err := s.schedule(ev); err != nil {
				return nil, err
			}
		}
		for _, ds := range sortedKeys(s.dstores) {
			d := s.dstores[ds]
			if d.driver == policy.DriverThrottle {
				d.startThrottle()
				continue
			}
			s.eng.At(d.periodNs, d.control)
		}
		s.rec.startSampling(sc.durNs)
		s.eng.Run(sc.durNs)
		res.Runs = append(res.Runs, &RunResult{Name: run.Name, sim: s, Events: s.eng.Fired, Log: s.Log})
	}
	sum := Summary{Scenario: sc.Name, Seed: sc.Seed, Duration: float64(sc.durNs) / 1e9, Passed: true}
	for _, r := range res.Runs {
		sum.Runs = append(sum.Runs, RunSummary{Name: r.Name, Events: r.Events, Log: r.Log})
	}
	for _, x := range sc.Expect {
		o := res.evaluate(x)
		if !o.Pass && !o.Pending {
			sum.Passed = false
		}
		sum.Expect = append(sum.Expect, o)
	}
	res.Summary = sum
	return res, nil
}

func (res *Result) run(name string) *RunResult {
	if name == "" {
		return res.Runs[0]
	}
	for _, r := range res.Runs {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// metric measures one metric of a run over [fromNs, toNs) and gives its
// display unit and the scale from display unit to raw value.
func (res *Result) metric(run, metric, of string, fromNs, toNs int64) (float64, string, error) {
	r := res.run(run)
	if r == nil {
		return 0, "", fmt.Errorf("unknown run %q", run)
	}
	rec := r.sim.rec
	get := func(prefix string) (*Series, error) {
		s := rec.series[prefix+of]
		if s == nil {
			return nil, fmt.Errorf("nothing recorded for %s%s", prefix, of)
		}
		return s, nil
	}
	var s *Series
	var err error
	switch metric {
	case "rate":
		if s, err = get(prefRate); err == nil {
			return s.Rate(fromNs, toNs), "bps", nil
		}
	case "min_rate":
		if s, err = get(prefRate); err == nil {
			return s.MinRate(fromNs, toNs), "bps", nil
		}
	case "iops":
		if s, err = get(prefIOPS); err == nil {
			return s.Rate(fromNs, toNs), "IOPS", nil
		}
	case "iops_share":
		if s, err = get(prefIOPS); err == nil {
			total := 0.0
			for _, n := range rec.names() {
				if hasPrefix(n, prefIOPS) {
					total += rec.series[n].Rate(fromNs, toNs)
				}
			}
			if total == 0 {
				return 0, "", fmt.Errorf("no I/O in the window")
			}
			return s.Rate(fromNs, toNs) / total, "fraction", nil
		}
	case "latency":
		if s, err = get(prefLat); err == nil {
			return s.Mean(fromNs, toNs), "ms", nil
		}
	case "orders":
		if s, err = get(prefOrders); err == nil {
			return s.Rate(fromNs, toNs), "orders/s", nil
		}
	case "order_time":
		if s, err = get(prefOrderT); err == nil {
			return s.Mean(fromNs, toNs), "ms", nil
		}
	case "rr":
		if s, err = get(prefRR); err == nil {
			return s.Mean(fromNs, toNs), "us", nil
		}
	case "qdepth":
		if s, err = get(prefQDepth); err == nil {
			return s.Mean(fromNs, toNs), "I/Os", nil
		}
	case "dslat":
		if s, err = get(prefDSLat); err == nil {
			return s.Mean(fromNs, toNs), "ms", nil
		}
	case "budget":
		if s, err = get(prefBudget); err == nil {
			return s.Mean(fromNs, toNs), "IOPS", nil
		}
	case "hostlat":
		if s, err = get(prefHostLat); err == nil {
			return s.Mean(fromNs, toNs), "ms", nil
		}
	case "pardalat":
		if s, err = get(prefPardaLat); err == nil {
			return s.Mean(fromNs, toNs), "ms", nil
		}
	case "throttle":
		if s, err = get(prefThrottle); err == nil {
			return s.Mean(fromNs, toNs), "IOPS", nil
		}
	case "iops_error":
		v, err := r.sim.iopsError(of, fromNs, toNs)
		return v, "fraction", err
	case "iops_ent":
		v, err := r.sim.iopsVsEntitled(of, fromNs, toNs)
		return v, "ratio", err
	case "cpu":
		if of == "all" {
			total := 0.0
			for _, n := range rec.names() {
				if hasPrefix(n, prefCPU) {
					total += rec.series[n].Rate(fromNs, toNs)
				}
			}
			return total / 1e6, "MHz", nil
		}
		if s, err = get(prefCPU); err == nil {
			return s.Rate(fromNs, toNs) / 1e6, "MHz", nil
		}
	case "irq":
		if s, err = get(prefIRQ); err == nil {
			return s.Rate(fromNs, toNs), "IRQ/s", nil
		}
	default:
		return 0, "", fmt.Errorf("unknown metric %q (rate, min_rate, iops, iops_share, iops_error, iops_ent, latency, orders, order_time, rr, qdepth, dslat, budget, hostlat, pardalat, throttle, cpu, irq)", metric)
	}
	return 0, "", err
}

func (res *Result) evaluate(x ExpectSpec) Outcome {
	sc := res.Scenario
	o := Outcome{Name: x.Name, Run: x.Run, Metric: x.Metric, Of: x.Of, Seed: x.Seed, Source: "sim", How: sc.Calibration}
	if o.How == "" {
		o.How = "model defaults"
	}
	fail := func(err error) Outcome {
		o.Pass, o.Verdict, o.Pending = false, "", false
		o.Error = fmt.Sprintf("%s:%d: %v", sc.file, x.Line, err)
		return o
	}
	if x.Kind == "live" {
		return res.evaluateLive(x, o, fail)
	}
	if o.Run == "" {
		o.Run = sc.Runs[0].Name
	}
	from, err := durNs(x.From, 0)
	if err != nil {
		return fail(err)
	}
	to, err := durNs(x.To, sc.durNs)
	if err != nil {
		return fail(err)
	}
	o.Window = fmt.Sprintf("%g–%gs", float64(from)/1e9, float64(to)/1e9)
	v, unit, err := res.metric(o.Run, x.Metric, x.Of, from, to)
	if err != nil {
		return fail(err)
	}
	if ref := x.RelativeTo; ref != nil {
		rr, rm, ro, rf, rt := ref.Run, ref.Metric, ref.Of, from, to
		if rr == "" {
			rr = o.Run
		}
		if rm == "" {
			rm = x.Metric
		}
		if ro == "" {
			ro = x.Of
		}
		if ref.From != "" {
			if rf, err = durNs(ref.From, 0); err != nil {
				return fail(err)
			}
		}
		if ref.To != "" {
			if rt, err = durNs(ref.To, 0); err != nil {
				return fail(err)
			}
		}
		b, _, err := res.metric(rr, rm, ro, rf, rt)
		if err != nil {
			return fail(err)
		}
		if ref.Diff {
			v -= b
		} else {
			if b == 0 {
				return fail(fmt.Errorf("reference is zero"))
			}
			v, unit = v/b, "ratio"
		}
	}
	return judge(x, o, v, unit, fail)
}

// evaluateLive judges a kind: live expectation against its live figure,
// or marks it pending when there is none.
func (res *Result) evaluateLive(x ExpectSpec, o Outcome, fail func(error) Outcome) Outcome {
	o.Source, o.How, o.Run, o.Window = "live", x.Live, "live", "—"
	if x.Live == "" {
		return fail(fmt.Errorf("live: a kind: live expectation names its live measurement"))
	}
	unit := x.Unit
	if unit == "" {
		unit = "ratio"
	}
	var f LiveFigure
	ok := false
	if lf := res.Scenario.Live; lf != nil {
		f, ok = lf.Figures[x.Name]
		if ok && lf.Source != "" {
			o.How = x.Live + "; " + lf.Source
		}
	}
	if !ok {
		o = judge(x, o, math.NaN(), unit, fail)
		o.Measured = 0 // not measured (and JSON has no NaN)
		if o.Error == "" {
			o.Pending, o.Verdict = true, "needs the live measurement"
		}
		return o
	}
	if f.Unit != unit {
		return fail(fmt.Errorf("live figure in %q, want %q", f.Unit, unit))
	}
	return judge(x, o, f.Value, unit, fail)
}

// judge compares the measure v (in unit) with the expectation.
func judge(x ExpectSpec, o Outcome, v float64, unit string, fail func(error) Outcome) Outcome {
	o.Measured, o.Unit = v, unit
	want, err := parseValue(x.Value)
	if err != nil {
		return fail(fmt.Errorf("value: %v", err))
	}
	tol := 0.0
	rel := false
	if t, ok := strings.CutSuffix(x.Tol, "%"); ok {
		if tol, err = strconv.ParseFloat(t, 64); err != nil {
			return fail(fmt.Errorf("tol: bad %q", x.Tol))
		}
		tol, rel = tol/100, true
	} else if x.Tol != "" {
		if tol, err = parseValue(x.Tol); err != nil {
			return fail(fmt.Errorf("tol: %v", err))
		}
	}
	if rel {
		tol *= math.Abs(want)
	}
	switch x.Op {
	case "", "=":
		o.Pass = math.Abs(v-want) <= tol
		o.Expected = fmt.Sprintf("%s ± %s", fmtVal(want, unit), fmtVal(tol, unit))
	case ">=":
		o.Pass = v >= want-tol
		o.Expected = "≥ " + fmtVal(want, unit)
	case "<=":
		o.Pass = v <= want+tol
		o.Expected = "≤ " + fmtVal(want, unit)
	case "between":
		hi, err := parseValue(x.Max)
		if err != nil {
			return fail(fmt.Errorf("max: %v", err))
		}
		o.Pass = v >= want-tol && v <= hi+tol
		o.Expected = fmt.Sprintf("%s … %s", fmtVal(want, unit), fmtVal(hi, unit))
	default:
		return fail(fmt.Errorf("op: unknown %q (=, >=, <=, between)", x.Op))
	}
	switch x.Kind {
	case "", "control":
	case "baseline":
		if !o.Pass {
			o.Verdict = "calibration difference"
		}
	case "live":
	default:
		return fail(fmt.Errorf("kind: unknown %q (control, baseline, live)", x.Kind))
	}
	if x.Better != "" {
		sv := want
		if x.SeedValue != "" {
			if sv, err = parseValue(x.SeedValue); err != nil {
				return fail(fmt.Errorf("seedValue: %v", err))
			}
		}
		var beats bool
		switch x.Better {
		case "higher":
			beats = v > sv*(1+beatMargin)
		case "lower":
			beats = v < sv*(1-beatMargin)
		default:
			return fail(fmt.Errorf("better: unknown %q (higher, lower)", x.Better))
		}
		switch {
		case o.Pass && beats:
			o.Verdict = "beats the seed"
		case o.Pass:
			o.Verdict = "meets the seed"
		case beats:
			o.Verdict = "beyond the sanity bound"
		default:
			o.Verdict = "short of the seed"
		}
	}
	return o
}

// beatMargin is how much better than the seed's figure a control outcome
// must be to be reported as beating it (1%, above run-to-run noise of the
// windowed means).
const beatMargin = 0.01

// parseValue reads a number, a percentage, a rate or a time (to ms).
func parseValue(s string) (float64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		return f / 100, err
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f, nil
	}
	if strings.HasSuffix(s, "bps") {
		r, err := policy.ParseRate(s)
		return float64(r), err
	}
	if d, err := durNs(s, 0); err == nil {
		return float64(d) / 1e6, nil
	}
	return 0, fmt.Errorf("bad value %q", s)
}

func fmtVal(v float64, unit string) string {
	switch unit {
	case "bps":
		return fmt.Sprintf("%.3g Gbps", v/1e9)
	case "fraction", "ratio":
		return fmt.Sprintf("%.1f%%", v*100)
	}
	return fmt.Sprintf("%.4g %s", v, unit)
}

// measuredText is the measure as the report shows it.
func (o *Outcome) measuredText() string {
	switch {
	case o.Error != "":
		return o.Error
	case o.Pending:
		return "— (not measured here)"
	}
	return fmtVal(o.Measured, o.Unit)
}

// Text renders the summary as a table: measured vs expected.
func (sum *Summary) Text() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "scenario %s (seed %d, %gs simulated)\n", sum.Scenario, sum.Seed, sum.Duration)
	for _, r := range sum.Runs {
		fmt.Fprintf(&b, "run %s: %d events\n", r.Name, r.Events)
		for _, l := range r.Log {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nresult\texpectation\trun\twindow\tmeasured\texpected\tseed\tvs seed")
	for _, o := range sum.Expect {
		st := "ok"
		switch {
		case o.Pending:
			st = "live"
		case !o.Pass:
			st = "FAIL"
		}
		m := o.measuredText()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", st, o.Name, o.Run, o.Window, m, o.Expected, o.Seed, o.Verdict)
	}
	tw.Flush()
	pending := 0
	for _, o := range sum.Expect {
		if o.Pending {
			pending++
		}
	}
	if pending > 0 {
		fmt.Fprintf(&b, "%d live expectations not measured here (make reproduce-live)\n", pending)
	}
	switch {
	case sum.Passed && pending > 0:
		fmt.Fprintln(&b, "every simulated expectation met")
	case sum.Passed:
		fmt.Fprintln(&b, "all expectations met")
	default:
		fmt.Fprintln(&b, "SOME EXPECTATIONS FAILED")
	}
	return b.String()
}

// Markdown renders the summary as a report section: a table "seed vs
// sluice" per expectation and the run logs. Plots are linked from dir
// (relative to the report).
func (res *Result) Markdown(dir string) string {
	sum := &res.Summary
	var b bytes.Buffer
	fmt.Fprintf(&b, "## %s\n\n%s\n\n", sum.Scenario, strings.TrimSpace(res.Scenario.Description))
	fmt.Fprintf(&b, "Seed %d, %g s simulated per run; runs: ", sum.Seed, sum.Duration)
	for i, r := range sum.Runs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%d events)", r.Name, r.Events)
	}
	b.WriteString(".\n\n| | expectation | measured by | run | window | seed | sluice (measured) | expected | vs seed |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, o := range sum.Expect {
		st := "✅"
		switch {
		case o.Pending:
			st = "⏳"
		case !o.Pass:
			st = "❌"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", st, o.Name, o.Source+": "+o.How, o.Run, o.Window, o.Seed, o.measuredText(), o.Expected, o.Verdict)
	}
	for _, r := range sum.Runs {
		if len(r.Log) > 0 {
			fmt.Fprintf(&b, "\nRun %s:\n\n", r.Name)
			for _, l := range r.Log {
				fmt.Fprintf(&b, "- %s\n", l)
			}
		}
	}
	b.WriteString("\n")
	specs := res.Scenario.Plots
	for _, p := range specs {
		fmt.Fprintf(&b, "![%s](%s/%s.png)\n", p.Title, dir, p.Name)
	}
	b.WriteString("\n")
	return b.String()
}

// Write puts the CSV series, the summary (JSON and text) and the plots of
// a result into dir.
func (res *Result) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range res.Runs {
		var b bytes.Buffer
		r.sim.rec.writeCSV(&b, res.Scenario.durNs, res.Scenario.Record)
		if err := os.WriteFile(filepath.Join(dir, "series-"+r.Name+".csv"), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	j, err := json.MarshalIndent(res.Summary, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(res.Summary.Text()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(res.Markdown(filepath.Base(dir))), 0o644); err != nil {
		return err
	}
	return res.plot(dir)
}
