package sim

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
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
		if err := drawPlot(r.sim.rec, ps, res.Scenario.durNs, dir); err != nil {
			return err
		}
	}
	return nil
}

func drawPlot(rec *Recorder, ps PlotSpec, untilNs int64, dir string) error {
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
	p.Legend.Top = true
	iv := float64(rec.IntervalNs) / 1e9
	nb := int(untilNs / rec.IntervalNs)
	var args []any
	for _, n := range names {
		s := rec.series[n]
		pts := make(plotter.XYs, nb)
		for i := range nb {
			v := 0.0
			if i < len(s.Sum) {
				v = s.value(i, iv)
			}
			pts[i] = plotter.XY{X: float64(i+1) * iv, Y: v * scale}
		}
		label := n[strings.IndexByte(n, ':')+1:]
		args = append(args, label, pts)
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return err
	}
	for _, ext := range []string{"svg", "png"} {
		if err := p.Save(9*vg.Inch, 5*vg.Inch, filepath.Join(dir, ps.Name+"."+ext)); err != nil {
			return err
		}
	}
	return nil
}

// drawExpectations draws, per expectation (in order), the expected value
// next to the measured one as bars: the "seed vs sluice" figure of a sweep.
// Values are shown in the display unit of each measure times Scale.
func (res *Result) drawExpectations(ps PlotSpec, dir string) error {
	scale := ps.Scale
	if scale == 0 {
		scale = 1
	}
	var want, got plotter.Values
	var names []string
	for i, o := range res.Summary.Expect {
		x := res.Scenario.Expect[i]
		w, err := parseValue(x.Value)
		if err != nil || o.Error != "" {
			continue
		}
		want = append(want, w*scale)
		got = append(got, o.Measured*scale)
		names = append(names, o.Name)
	}
	if len(names) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = ps.Title
	p.Y.Label.Text = ps.YLabel
	w := vg.Points(8)
	b1, err := plotter.NewBarChart(want, w)
	if err != nil {
		return err
	}
	b1.Color = plotutil.Color(0)
	b1.Offset = -w / 2
	b2, err := plotter.NewBarChart(got, w)
	if err != nil {
		return err
	}
	b2.Color = plotutil.Color(1)
	b2.Offset = w / 2
	p.Add(b1, b2)
	p.Legend.Add("seed (expected)", b1)
	p.Legend.Add("sluice (simulated)", b2)
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -1
	for _, ext := range []string{"svg", "png"} {
		if err := p.Save(10*vg.Inch, 5*vg.Inch, filepath.Join(dir, ps.Name+"."+ext)); err != nil {
			return err
		}
	}
	return nil
}
