package sim

import (
	"math"
	"path/filepath"
	"reflect"
	"testing"
)

// Seed 003's own points lie on a line with R² ≈ 0.99 ("surprisingly
// linear"); a line through two points is exact; the CSV file reads back.
func TestSweepFitAndCSV(t *testing.T) {
	s, _, r2 := FitSweep(Seed003)
	if r2 < 0.98 || s < 0.2 || s > 0.25 {
		t.Errorf("seed 003 fit: %.4f Gbps per %% of a core, R² %.4f; want ≈ 0.22 and ≥ 0.98", s, r2)
	}
	s, c, r2 := FitLine([]float64{1, 3}, []float64{2, 6})
	if s != 2 || c != 0 || r2 != 1 {
		t.Errorf("FitLine through (1,2), (3,6) = %v, %v, %v; want 2, 0, 1", s, c, r2)
	}
	if s, _, _ := FitLine([]float64{1}, []float64{1}); !math.IsNaN(s) {
		t.Errorf("FitLine of one point = %v, want NaN", s)
	}
	path := filepath.Join(t.TempDir(), "sweep.csv")
	if err := WriteSweepCSV(path, []string{"a comment"}, Seed003); err != nil {
		t.Fatal(err)
	}
	com, pts, err := ReadSweepCSV(path)
	if err != nil || !reflect.DeepEqual(com, []string{"a comment"}) || len(pts) != len(Seed003) || pts[11].LimitMHz != 400 || pts[11].Gbps != 2.2 {
		t.Errorf("read back: %v %v %v", com, pts, err)
	}
}

// The CPU model fitted to seed 003's whole sweep: the knee's two slopes
// and offset as docs/sim.md gives them, every limited point within 10%,
// the unlimited point exact, and SendBps the inverse of SendMHz.
func TestSeed003Fit(t *testing.T) {
	p := DefaultCPUParams
	seg := float64(DefaultNetParams.SegmentBytes)
	lowGbpsPerGHz := 8 / (p.CyclesPerByte + p.CyclesPerAck/p.AckBytes)
	highGbpsPerGHz := 8 / p.CyclesPerByte
	offsetMHz := p.CyclesPerAck * p.MaxAckRate / 1e6
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"low slope, Gbps per GHz", lowGbpsPerGHz, 4.95},
		{"high slope, Gbps per GHz", highGbpsPerGHz, 9.457},
		{"offset, MHz", offsetMHz, 506.8},
		{"peak, MHz", p.PeakMHz, 2642.8},
		{"cycles per ACK", p.CyclesPerAck, 2231},
	} {
		if math.Abs(c.got-c.want) > 0.001*c.want {
			t.Errorf("%s = %.4g, want %.4g", c.name, c.got, c.want)
		}
	}
	for _, pt := range Seed003 {
		got := p.SendBps(float64(pt.LimitMHz), seg) / 1e9
		if e := math.Abs(got-pt.Gbps) / pt.Gbps; e > 0.101 {
			t.Errorf("%d MHz: model %.2f Gbps, seed %.2f (%.0f%% off)", pt.LimitMHz, got, pt.Gbps, 100*e)
		}
		if back := p.SendMHz(got*1e9, seg); math.Abs(back-float64(pt.LimitMHz)) > 1e-6 {
			t.Errorf("%d MHz: SendMHz(SendBps) = %.6f", pt.LimitMHz, back)
		}
	}
	if got := p.SendBps(p.PeakMHz, seg) / 1e9; math.Abs(got-Seed003Unlimited) > 1e-9 {
		t.Errorf("unlimited: model %.4f Gbps, seed %.1f", got, Seed003Unlimited)
	}
}
