package sim

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Seed 003's figure, throughput against CPU allocation, for the live
// sweep (livetest/cpulive) and the reproduction report: the points, a
// straight-line fit, a CSV file of points and the plot of several sweeps
// side by side.

// SweepPoint is one point of a throughput-vs-CPU sweep.
type SweepPoint struct {
	LimitMHz int // the CPU limit; 0: unlimited
	// AllocPct is the CPU allocation in % of one core: the limit, or for
	// the unlimited point what the VM used.
	AllocPct     float64
	Gbps         float64 // payload throughput (iperf)
	UsedPct      float64 // CPU the VM used, % of one core (-1: not measured)
	ReadyPct     float64 // ready-time analog, % of wall time (-1: not measured)
	ThrottledPct float64 // time throttled, % of wall time summed over the CPUs (-1: not measured)
}

// Seed003MHz is the core clock of seed 003's host (E5-2670, 2.6 GHz): its
// limits in MHz are % of a core against it.
const Seed003MHz = 2600

// Seed003 are seed 003's limited points (the text's list; the unlimited
// run, 20.2 Gbps at a turbo clock the seed does not give, is left out).
var Seed003 = func() []SweepPoint {
	gbps := []float64{19.2, 17.7, 16.4, 14.7, 12.1, 10.3, 8.5, 6.5, 5.2, 4.1, 2.7, 2.2}
	var out []SweepPoint
	for i, g := range gbps {
		mhz := 2600 - 200*i
		out = append(out, SweepPoint{LimitMHz: mhz, AllocPct: 100 * float64(mhz) / Seed003MHz, Gbps: g, UsedPct: -1, ReadyPct: -1, ThrottledPct: -1})
	}
	return out
}()

// Seed003Unlimited is seed 003's unlimited run, Gbps.
const Seed003Unlimited = 20.2

// FitKnee fits the CPU model of CPUParams to a sweep of limited points
// (LimitMHz > 0) and the unlimited rate (Gbps): throughput
// max(s1·C, s2·(C − o)) against the limit C, the two regimes of the ACK
// path (every ACK a pass below the knee, passes capped above it). For
// each split of the points into a lower and an upper part it fits s1
// through the origin to the lower part by least maximum relative error
// and s2, o to the upper part by least squares of the relative error;
// it keeps the split whose curve has the least maximum relative error
// over all points, then the least sum of squares. From s1, s2 (Gbps per
// GHz) and o (MHz), with one ACK per ackBytes of payload:
// CyclesPerByte = 8/s2, CyclesPerAck = ackBytes·(8/s1 − 8/s2),
// MaxAckRate = o·10⁶/CyclesPerAck, and PeakMHz is where the upper
// regime gives unlimitedGbps. Fewer than four limited points give a
// zero CPUParams.
func FitKnee(pts []SweepPoint, unlimitedGbps float64, ackBytes int64) CPUParams {
	var c, t []float64
	for _, p := range pts {
		if p.LimitMHz > 0 && p.Gbps > 0 {
			c = append(c, float64(p.LimitMHz)/1000)
			t = append(t, p.Gbps)
		}
	}
	idx := make([]int, len(c))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return c[idx[a]] < c[idx[b]] })
	n := len(idx)
	if n < 4 {
		return CPUParams{}
	}
	var best struct{ worst, sse, s1, s2, o float64 }
	best.worst = math.Inf(1)
	for k := 2; k <= n-2; k++ {
		// Lower part, through the origin: the ratio t/c spans [lo, hi];
		// s1 = 2/(1/lo + 1/hi) balances the largest errors.
		rmin, rmax := math.Inf(1), 0.0
		for _, i := range idx[:k] {
			r := c[i] / t[i]
			rmin, rmax = math.Min(rmin, r), math.Max(rmax, r)
		}
		s1 := 2 / (rmin + rmax)
		// Upper part: t = a·c + b, weights 1/t².
		var sw, sx, sy, sxx, sxy float64
		for _, i := range idx[k:] {
			w := 1 / (t[i] * t[i])
			sw += w
			sx += w * c[i]
			sy += w * t[i]
			sxx += w * c[i] * c[i]
			sxy += w * c[i] * t[i]
		}
		a := (sw*sxy - sx*sy) / (sw*sxx - sx*sx)
		b := (sy - a*sx) / sw
		if !(a > s1) || b >= 0 {
			continue // no knee: the upper line must be steeper and start above 0 MHz
		}
		s2, o := a, -b/a
		var worst, sse float64
		for i := range c {
			e := (math.Max(s1*c[i], s2*(c[i]-o)) - t[i]) / t[i]
			worst, sse = math.Max(worst, math.Abs(e)), sse+e*e
		}
		if worst < best.worst-1e-12 || (math.Abs(worst-best.worst) <= 1e-12 && sse < best.sse) {
			best.worst, best.sse, best.s1, best.s2, best.o = worst, sse, s1, s2, o
		}
	}
	if math.IsInf(best.worst, 1) {
		return CPUParams{}
	}
	ab := float64(ackBytes)
	perAck := ab * (8/best.s1 - 8/best.s2)
	return CPUParams{
		CyclesPerByte: 8 / best.s2,
		CyclesPerAck:  perAck,
		AckBytes:      ab,
		MaxAckRate:    best.o * 1e9 / perAck, // o in GHz
		PeakMHz:       1000 * (unlimitedGbps/best.s2 + best.o),
	}
}

// FitLine fits y = slope·x + intercept by least squares and returns the
// coefficient of determination R² (1 − residual/total sum of squares).
// Fewer than two points or no spread in x give NaN.
func FitLine(x, y []float64) (slope, intercept, r2 float64) {
	n := float64(len(x))
	if len(x) < 2 || len(x) != len(y) {
		return math.NaN(), math.NaN(), math.NaN()
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx, my = mx/n, my/n
	var sxx, sxy, syy float64
	for i := range x {
		sxx += (x[i] - mx) * (x[i] - mx)
		sxy += (x[i] - mx) * (y[i] - my)
		syy += (y[i] - my) * (y[i] - my)
	}
	if sxx == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	slope = sxy / sxx
	intercept = my - slope*mx
	if syy == 0 {
		return slope, intercept, 1
	}
	var res float64
	for i := range x {
		d := y[i] - (slope*x[i] + intercept)
		res += d * d
	}
	return slope, intercept, 1 - res/syy
}

// FitSweep fits Gbps against AllocPct over the points.
func FitSweep(pts []SweepPoint) (gbpsPerPct, intercept, r2 float64) {
	var x, y []float64
	for _, p := range pts {
		x = append(x, p.AllocPct)
		y = append(y, p.Gbps)
	}
	return FitLine(x, y)
}

const sweepHeader = "limit_mhz,alloc_pct,gbps,used_pct,ready_pct,throttled_pct"

// WriteSweepCSV writes the points as CSV, after comment lines ("# ...").
func WriteSweepCSV(path string, comments []string, pts []SweepPoint) error {
	var b strings.Builder
	for _, c := range comments {
		fmt.Fprintf(&b, "# %s\n", c)
	}
	b.WriteString(sweepHeader + "\n")
	for _, p := range pts {
		fmt.Fprintf(&b, "%d,%.2f,%.4f,%.2f,%.2f,%.2f\n", p.LimitMHz, p.AllocPct, p.Gbps, p.UsedPct, p.ReadyPct, p.ThrottledPct)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// ReadSweepCSV reads what WriteSweepCSV wrote: the comments (without
// "# ") and the points.
func ReadSweepCSV(path string) (comments []string, pts []SweepPoint, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		s := sc.Text()
		if c, ok := strings.CutPrefix(s, "#"); ok {
			comments = append(comments, strings.TrimSpace(c))
			continue
		}
		if s == sweepHeader || strings.TrimSpace(s) == "" {
			continue
		}
		f := strings.Split(s, ",")
		if len(f) != 6 {
			return nil, nil, fmt.Errorf("%s:%d: want 6 fields (%s), got %d", path, line, sweepHeader, len(f))
		}
		var v [6]float64
		for i := range f {
			if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
				return nil, nil, fmt.Errorf("%s:%d: field %d: %v", path, line, i+1, err)
			}
		}
		pts = append(pts, SweepPoint{LimitMHz: int(v[0]), AllocPct: v[1], Gbps: v[2], UsedPct: v[3], ReadyPct: v[4], ThrottledPct: v[5]})
	}
	return comments, pts, sc.Err()
}

// SweepCurve is one labelled sweep of a plot.
type SweepCurve struct {
	Label  string
	Points []SweepPoint
}

// PlotSweeps draws the curves as throughput relative to each curve's
// point at a limit of 100% of a core (so that a 20 Gbps host and a
// 1 Gbps lab guest can be compared) against the allocation in % of a
// core, and saves base.svg and base.png.
func PlotSweeps(base, title string, curves ...SweepCurve) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "CPU allocation (% of one core)"
	p.Y.Label.Text = "throughput / throughput at a 100% limit"
	p.X.Min, p.Y.Min = 0, 0
	var args []any
	for _, c := range curves {
		ref := 0.0
		for _, pt := range c.Points {
			if pt.LimitMHz > 0 && math.Abs(pt.AllocPct-100) < 0.5 {
				ref = pt.Gbps
			}
		}
		if ref == 0 {
			return fmt.Errorf("plot %s: curve %q has no point at a 100%% limit", base, c.Label)
		}
		var xy plotter.XYs
		for _, pt := range c.Points {
			xy = append(xy, plotter.XY{X: pt.AllocPct, Y: pt.Gbps / ref})
		}
		sort.Slice(xy, func(i, j int) bool { return xy[i].X < xy[j].X })
		args = append(args, c.Label, xy)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return savePlot(p, 10*vg.Inch, 5*vg.Inch, base)
}

// Sweep reads the result of a sweep scenario (as scenarios/seeds/
// cpu-limit-sweep.yaml): one point per expectation on a rate, at the CPU
// limit its run sets (a cpuLimit event in MHz; none: unlimited, placed at
// the model's peak clock) against a core of coreMHz.
func (res *Result) Sweep(coreMHz float64) ([]SweepPoint, error) {
	peak := DefaultCPUParams.PeakMHz
	if c := res.Scenario.Models.CPU; c != (ModelSpec{}).CPU {
		peak = c.PeakMHz // the scenario's own CPU model
		if peak == 0 {
			peak = coreMHz
		}
	}
	limits := map[string]int{}
	for _, r := range res.Scenario.Runs {
		for _, e := range r.Events {
			if e.CPULimit == "" {
				continue
			}
			v, ok := strings.CutSuffix(e.CPULimit, "MHz")
			n, err := strconv.Atoi(v)
			if !ok || err != nil || n <= 0 {
				return nil, fmt.Errorf("run %s: cpuLimit %q: want MHz", r.Name, e.CPULimit)
			}
			limits[r.Name] = n
		}
	}
	var out []SweepPoint
	for _, o := range res.Summary.Expect {
		if o.Metric != "rate" {
			continue
		}
		lim := limits[o.Run]
		pt := SweepPoint{LimitMHz: lim, AllocPct: 100 * float64(lim) / coreMHz, Gbps: o.Measured / 1e9, UsedPct: -1, ReadyPct: -1, ThrottledPct: -1}
		if lim == 0 {
			pt.AllocPct = 100 * peak / coreMHz
		}
		out = append(out, pt)
	}
	return out, nil
}
