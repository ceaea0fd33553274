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
