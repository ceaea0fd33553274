package sim

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// defaultPlots draws every family of series of the first run.
var defaultPlots = []PlotSpec{
	{Name: "throughput", Title: "Throughput per port", Series: []string{prefRate}, YLabel: "Gbps", Scale: 1e-9},
	{Name: "iops", Title: "IOPS per disk", Series: []string{prefIOPS}, YLabel: "IOPS", Scale: 1},
	{Name: "latency", Title: "I/O latency per disk", Series: []string{prefLat}, YLabel: "ms", Scale: 1},
	{Name: "qdepth", Title: "Host queue depth per datastore", Series: []string{prefQDepth}, YLabel: "outstanding I/Os", Scale: 1},
	{Name: "orders", Title: "Orders per second", Series: []string{prefOrders}, YLabel: "orders/s", Scale: 1},
	{Name: "response", Title: "Response time", Series: []string{prefRR}, YLabel: "µs", Scale: 1},
}

func (res *Result) plot(dir string) error {
	specs := res.Scenario.Plots
	if len(specs) == 0 {
		for _, r := range res.Runs {
			for _, p := range defaultPlots {
				p.Run = r.Name
				p.Name = r.Name + "-" + p.Name
				p.Title = p.Title + " (" + r.Name + ")"
				specs = append(specs, p)
			}
		}
	}
	for _, ps := range specs {
		if ps.Kind == "expectations" {
			if err := res.drawExpectations(ps, dir); err != nil {
				return err
			}
			continue
		}
		r := res.run(ps.Run)
		if r == nil {
			return fmt.Errorf("plot %s: unknown run %q", ps.Name, ps.Run)
		}
		if err := res.drawPlot(r, ps, dir); err != nil {
			return err
		}
	}
	return nil
}

func (res *Result) drawPlot(r *RunResult, ps PlotSpec, dir string) error {
	rec, untilNs := r.sim.rec, res.Scenario.durNs
	scale := ps.Scale
	if scale == 0 {
		scale = 1
	}
	var names []string
	for _, n := range rec.names() {
		for _, want := range ps.Series {
			if n == want || (strings.HasSuffix(want, ":") && hasPrefix(n, want)) {
				names = append(names, n)
				break
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = ps.Title
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = ps.YLabel
	iv := float64(rec.IntervalNs) / 1e9
	nb := int(untilNs / rec.IntervalNs)
	var lines []plotter.XYs
	var labels []string
	yMax := 0.0
	for _, n := range names {
		s := rec.series[n]
		pts := make(plotter.XYs, nb)
		for i := range nb {
			v := 0.0
			if i < len(s.Sum) {
				v = s.value(i, iv)
			}
			pts[i] = plotter.XY{X: float64(i+1) * iv, Y: v * scale}
			yMax = math.Max(yMax, v*scale)
		}
		label := n[strings.IndexByte(n, ':')+1:]
		lines, labels = append(lines, pts), append(labels, label)
	}
	bands := res.seedBands(r.Name, names, scale)
	for _, b := range bands {
		for _, v := range []float64{b.lo, b.hi} {
			if !math.IsInf(v, 0) {
				yMax = math.Max(yMax, v)
			}
		}
	}
	if yMax <= 0 {
		yMax = 1
	}
	// The seed's figures first, under the lines.
	if len(bands) > 0 {
		for _, b := range bands {
			if err := addBand(p, b, yMax); err != nil {
				return err
			}
		}
		sw := draw.LineStyle{Color: bandColor, Width: vg.Points(8)}
		p.Legend.Add("seed's range (series' colour)", legendSwatch{sw})
	}
	for i, pts := range lines {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color, l.Dashes = plotutil.Color(i), plotutil.Dashes(i)
		p.Add(l)
		// A legend longer than the plot is tall says nothing: the first
		// ones, then how many more.
		switch {
		case len(lines) <= maxLegend || i < maxLegend-1:
			p.Legend.Add(labels[i], l)
		case i == maxLegend-1:
			p.Legend.Add(fmt.Sprintf("… and %d more", len(lines)-i), legendSwatch{})
		}
	}
	// Steps: a dashed line and a label at every event of the run.
	steps := stepMarks(res.runEvents(r.Name), float64(untilNs)/1e9)
	top := yMax * 1.12
	for i, st := range steps {
		l, err := plotter.NewLine(plotter.XYs{{X: st.x, Y: 0}, {X: st.x, Y: top}})
		if err != nil {
			return err
		}
		l.LineStyle = draw.LineStyle{Color: color.Gray{Y: 110}, Width: vg.Points(0.7), Dashes: []vg.Length{vg.Points(3), vg.Points(3)}}
		p.Add(l)
		// Alternate heights so that labels of close steps do not overlap.
		y := top * (1.0 - 0.055*float64(i%3))
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: []plotter.XY{{X: st.x, Y: y}}, Labels: []string{" " + st.label}})
		if err != nil {
			return err
		}
		lb.TextStyle[0].Font.Size = vg.Points(8)
		lb.TextStyle[0].YAlign = draw.YTop
		p.Add(lb)
	}
	p.Y.Min, p.Y.Max = 0, top*1.02
	p.X.Min, p.X.Max = 0, float64(untilNs)/1e9
	return savePlot(p, 10*vg.Inch, 5*vg.Inch, filepath.Join(dir, ps.Name))
}

// maxLegend is the most entries a time series' legend lists.
const maxLegend = 20

// bandColor fills the seed's expected ranges.
var bandColor = color.NRGBA{R: 120, G: 120, B: 120, A: 60}

// legendSwatch is a legend entry drawn as a thick line.
type legendSwatch struct{ sty draw.LineStyle }

func (s legendSwatch) Thumbnail(c *draw.Canvas) {
	if s.sty.Width == 0 {
		return
	}
	y := (c.Min.Y + c.Max.Y) / 2
	c.StrokeLine2(s.sty, c.Min.X, y, c.Max.X, y)
}

// band is the seed's expected range of one series over a window.
type band struct {
	from, to float64 // s
	lo, hi   float64 // in the plot's unit; hi = +Inf for "≥", lo = -Inf for "≤"
	series   int     // index of the series, for its colour; -1: grey
}

// seedBands are the expectations of run on the plotted series as ranges
// in the plot's unit: absolute ones (a rate, a depth, a time), and those
// relative to the same series over another window (a phase against
// another: the range times the reference window's mean). Each band has
// the colour of its series (names[series]).
func (res *Result) seedBands(run string, names []string, scale float64) []band {
	index := map[string]int{}
	for i, n := range names {
		index[n] = i
	}
	sc := res.Scenario
	var out []band
	for i, x := range sc.Expect {
		if x.Kind == "live" || i >= len(res.Summary.Expect) || res.Summary.Expect[i].Error != "" {
			continue
		}
		r := x.Run
		if r == "" {
			r = sc.Runs[0].Name
		}
		pref := map[string]string{"rate": prefRate, "min_rate": prefRate, "iops": prefIOPS, "latency": prefLat,
			"orders": prefOrders, "rr": prefRR, "qdepth": prefQDepth, "dslat": prefDSLat}[x.Metric]
		idx, shown := index[pref+x.Of]
		if r != run || pref == "" || !shown {
			continue
		}
		lo, hi, ok := expectRange(x)
		if !ok {
			continue
		}
		from, _ := durNs(x.From, 0)
		to, _ := durNs(x.To, sc.durNs)
		if ref := x.RelativeTo; ref != nil {
			// Only a window of the same series: another run or entity
			// is not on this plot's scale.
			if ref.Diff || (ref.Run != "" && ref.Run != r) || (ref.Metric != "" && ref.Metric != x.Metric) || (ref.Of != "" && ref.Of != x.Of) {
				continue
			}
			rf, rt := from, to
			if ref.From != "" {
				rf, _ = durNs(ref.From, 0)
			}
			if ref.To != "" {
				rt, _ = durNs(ref.To, 0)
			}
			base, _, err := res.metric(r, x.Metric, x.Of, rf, rt)
			if err != nil {
				continue
			}
			lo, hi = lo*base, hi*base
		}
		b := band{from: float64(from) / 1e9, to: float64(to) / 1e9, lo: lo * scale, hi: hi * scale, series: idx}
		if !slices.ContainsFunc(out, func(o band) bool { // one band for the same range of several series
			return o.from == b.from && o.to == b.to && o.lo == b.lo && o.hi == b.hi
		}) {
			out = append(out, b)
		}
	}
	return out
}

// expectRange is the range an expectation accepts, in its value's unit:
// lo = -Inf for "≤", hi = +Inf for "≥".
func expectRange(x ExpectSpec) (lo, hi float64, ok bool) {
	want, err := parseValue(x.Value)
	if err != nil {
		return 0, 0, false
	}
	tol := 0.0
	if t, ok := strings.CutSuffix(x.Tol, "%"); ok {
		f, _ := strconv.ParseFloat(t, 64)
		tol = math.Abs(want) * f / 100
	} else if x.Tol != "" {
		tol, _ = parseValue(x.Tol)
	}
	lo, hi = want-tol, want+tol
	switch x.Op {
	case ">=":
		hi = math.Inf(1)
	case "<=":
		lo = math.Inf(-1)
	case "between":
		m, err := parseValue(x.Max)
		if err != nil {
			return 0, 0, false
		}
		hi = m + tol
	}
	return lo, hi, true
}

// addBand draws a band as a filled rectangle; an open side ends at the
// plot's edge (0 or top).
func addBand(p *plot.Plot, b band, yMax float64) error {
	lo, hi := math.Max(b.lo, 0), math.Min(b.hi, yMax*1.12)
	if hi-lo < yMax*0.006 { // an exact figure: a thin band still shows
		lo, hi = lo-yMax*0.003, hi+yMax*0.003
	}
	poly, err := plotter.NewPolygon(plotter.XYs{{X: b.from, Y: lo}, {X: b.to, Y: lo}, {X: b.to, Y: hi}, {X: b.from, Y: hi}})
	if err != nil {
		return err
	}
	poly.Color = bandColor
	if b.series >= 0 {
		r, g, bl, _ := plotutil.Color(b.series).RGBA()
		poly.Color = color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(bl >> 8), A: 50}
	}
	poly.LineStyle.Width = 0
	p.Add(poly)
	return nil
}

// runEvents are the events of a run: the timeline's, the run's own, and
// the starts and stops of the workloads it runs.
func (res *Result) runEvents(run string) []EventSpec {
	sc := res.Scenario
	evs := append([]EventSpec(nil), sc.Timeline...)
	without := map[string]bool{}
	for _, rs := range sc.Runs {
		if rs.Name == run {
			evs = append(evs, rs.Events...)
			for _, w := range rs.Without {
				without[w] = true
			}
		}
	}
	for _, w := range sc.Workloads {
		if without[w.Name] || w.Start == "never" {
			continue
		}
		if w.Start != "" {
			evs = append(evs, EventSpec{At: w.Start, Start: w.Name})
		}
		if w.Stop != "" {
			evs = append(evs, EventSpec{At: w.Stop, Stop: w.Name})
		}
	}
	return evs
}

// step is one event of a run, for the plots.
type step struct {
	x     float64 // s
	label string
}

// stepMarks labels the events of a run that fall inside the plot.
func stepMarks(evs []EventSpec, untilS float64) []step {
	var out []step
	for _, e := range evs {
		at, err := durNs(e.At, 0)
		if err != nil {
			continue
		}
		x := float64(at) / 1e9
		if x <= 0 || x >= untilS {
			continue // an event at 0 s sets the run up; it is no step
		}
		out = append(out, step{x: x, label: stepLabel(e)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].x < out[j].x })
	return out
}

// stepLabel is a short description of an event.
func stepLabel(e EventSpec) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+v)
		}
	}
	switch {
	case e.Start != "":
		return e.Start + " starts"
	case e.Stop != "":
		return e.Stop + " stops"
	case e.DRS:
		return "DRS"
	case e.Fail != "":
		return e.Fail + " fails"
	case e.PowerOn != "":
		return e.PowerOn + " on"
	case e.Migrate != "":
		return e.Migrate + " → " + e.To
	case e.SIOC != "":
		s := "SIOC " + e.SIOC
		if e.Enabled != nil && !*e.Enabled {
			return s + " off"
		}
		return s + " on"
	}
	add("R=", e.Reservation)
	add("S=", e.Shares)
	add("L=", e.Limit)
	add("CPU L=", e.CPULimit)
	return strings.TrimSpace(e.Set + " " + strings.Join(parts, " "))
}

// savePlot writes p as PATH.svg and PATH.png, with its legend outside the
// data, to the right of the axes.
func savePlot(p *plot.Plot, w, h vg.Length, path string) error {
	leg := p.Legend
	p.Legend = plot.NewLegend()
	for _, ext := range []string{"svg", "png"} {
		c, err := draw.NewFormattedCanvas(w, h, ext)
		if err != nil {
			return err
		}
		dc := draw.New(c)
		lw := leg.Rectangle(dc).Max.X - leg.Rectangle(dc).Min.X + vg.Points(14)
		p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
		lc := draw.Crop(dc, w-lw+vg.Points(6), 0, 0, -vg.Points(28))
		leg.Top, leg.Left = true, true
		leg.Draw(lc)
		f, err := os.Create(path + "." + ext)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	p.Legend = leg
	return nil
}

// drawExpectations draws, per expectation (in order), the range the seed's
// figure allows as a band and sluice's measure as a point on it (● met,
// ✕ not met): the "seed vs sluice" figure of a sweep. Values are shown in
// the display unit of each measure times Scale; live rows not measured
// here are left out.
func (res *Result) drawExpectations(ps PlotSpec, dir string) error {
	scale := ps.Scale
	if scale == 0 {
		scale = 1
	}
	type item struct {
		name     string
		lo, hi   float64
		measured float64
		pass     bool
	}
	var items []item
	top := 0.0
	for i, o := range res.Summary.Expect {
		x := res.Scenario.Expect[i]
		lo, hi, ok := expectRange(x)
		if !ok || o.Error != "" || o.Pending {
			continue
		}
		it := item{name: o.Name, lo: lo * scale, hi: hi * scale, measured: o.Measured * scale, pass: o.Pass}
		items = append(items, it)
		top = math.Max(top, it.measured)
		for _, v := range []float64{it.lo, it.hi} {
			if !math.IsInf(v, 0) {
				top = math.Max(top, v)
			}
		}
	}
	if len(items) == 0 {
		return nil
	}
	top *= 1.1
	p := plot.New()
	p.Title.Text = ps.Title
	p.Y.Label.Text = ps.YLabel
	var met, missed plotter.XYs
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = it.name
		if err := addBand(p, band{from: float64(i) - 0.35, to: float64(i) + 0.35, lo: it.lo, hi: it.hi, series: -1}, top/1.12); err != nil {
			return err
		}
		if it.pass {
			met = append(met, plotter.XY{X: float64(i), Y: it.measured})
		} else {
			missed = append(missed, plotter.XY{X: float64(i), Y: it.measured})
		}
	}
	p.Legend.Add("seed (expected range)", legendSwatch{draw.LineStyle{Color: bandColor, Width: vg.Points(8)}})
	for _, m := range []struct {
		pts   plotter.XYs
		label string
		shape draw.GlyphDrawer
		col   color.Color
	}{
		{met, "sluice (simulated), met", draw.CircleGlyph{}, color.RGBA{R: 0, G: 140, B: 60, A: 255}},
		{missed, "sluice (simulated), not met", draw.CrossGlyph{}, color.RGBA{R: 200, G: 0, B: 0, A: 255}},
	} {
		if len(m.pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(m.pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle = draw.GlyphStyle{Shape: m.shape, Color: m.col, Radius: vg.Points(4)}
		p.Add(sc)
		p.Legend.Add(m.label, sc)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(items))-0.4
	p.Y.Min, p.Y.Max = 0, top
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -1
	return savePlot(p, 10*vg.Inch, 5*vg.Inch, filepath.Join(dir, ps.Name))
}
