package sim

import (
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"sluice/alloc"
)

var compareFlag = flag.Bool("compare", false, "TestDriverComparison: run scenarios/drivers and print the comparison of docs/perf/sim.md")

// TestDriverComparison prints, for every run of the scenarios of
// scenarios/drivers (the gateway and the throttle driver side by side),
// per-second accuracy and latency: the table of docs/perf/sim.md.
// It runs only with -compare (about a minute):
//
//	go test ./sim -run TestDriverComparison -compare -v
func TestDriverComparison(t *testing.T) {
	if !*compareFlag {
		t.Skip("only with -compare")
	}
	for _, f := range []string{"../scenarios/drivers/sioc-test1-drivers.yaml", "../scenarios/drivers/scale-drivers.yaml", "../scenarios/drivers/lab-drivers.yaml"} {
		sc, err := LoadScenario(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		from, to := 60*Second, sc.durNs
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s (%g–%g s, per second)\n", sc.Name, float64(from)/1e9, float64(to)/1e9)
		fmt.Fprintln(&b, "| run | IOPS | error vs entitlement: mean / p50 / p95 / max | same, hosts without R or L | datastore latency ms: mean / p5 / p95 | VM latency ms: mean / p95 | windows Σ: mean / CV | budgets Σ IOPS: mean / CV | throttles set per disk per s |")
		fmt.Fprintln(&b, "| --- | ---: | --- | --- | --- | --- | --- | --- | ---: |")
		for _, r := range res.Runs {
			s := r.sim
			ds := s.dstores["ds1"]
			all, err := s.iopsErrors("ds1", from, to)
			if err != nil {
				t.Fatal(err)
			}
			plain := plainDiskErrors(t, s, ds, from, to)
			var iops, latSum, latCnt float64
			var lats []float64
			sets := 0
			for _, dk := range ds.dks {
				iops += dk.iops.Rate(from, to)
				ls, lc := dk.lat.SumCount(from, to)
				latSum, latCnt = latSum+ls, latCnt+lc
				a, z := s.rec.window(from, to)
				for i := a; i < z && i < len(dk.lat.Sum); i++ {
					if dk.lat.Cnt[i] > 0 {
						lats = append(lats, dk.lat.Sum[i]/dk.lat.Cnt[i])
					}
				}
				if dk.tq != nil {
					sets += dk.tq.sets
				}
			}
			dsl := samples(s, prefDSLat+"ds1", from, to)
			win := sumSamples(s, prefQDepth, from, to)
			bud := sumSamples(s, prefBudget, from, to)
			budText, setText := "—", "—"
			if len(ds.thosts) > 0 {
				budText = fmt.Sprintf("%.0f / %.2f", mean(bud), cv(bud))
				setText = fmt.Sprintf("%.2f", float64(sets)/float64(len(ds.dks))/(float64(sc.durNs)/1e9))
			}
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %.1f / %.1f / %.1f | %.1f / %.1f | %.1f / %.2f | %s | %s |\n", r.Name, iops,
				dist(all), dist(plain), mean(dsl), pct(dsl, 5), pct(dsl, 95), latSum/latCnt, pct(lats, 95), mean(win), cv(win), budText, setText)
		}
		t.Log(b.String())
	}
}

// plainDiskErrors are iopsErrors of the disks on hosts where no disk of
// the datastore has a reservation or a limit (host budgets follow the
// hosts' shares, not the disks' entitlements, in both drivers).
func plainDiskErrors(t *testing.T, s *Sim, ds *datastore, from, to int64) []float64 {
	bent := map[string]bool{}
	for _, dk := range ds.dks {
		if dk.spec.ReservationIOPS > 0 || dk.spec.LimitIOPS < alloc.Inf {
			bent[dk.spec.Host] = true
		}
	}
	var out []float64
	for _, dk := range ds.dks {
		if bent[dk.spec.Host] {
			continue
		}
		e, err := s.iopsErrors(dk.name, from, to)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e...)
	}
	return out
}

func samples(s *Sim, name string, from, to int64) []float64 {
	ser := s.rec.series[name]
	var out []float64
	a, z := s.rec.window(from, to)
	for i := a; i < z && i < len(ser.Sum); i++ {
		out = append(out, ser.value(i, float64(s.rec.IntervalNs)/1e9))
	}
	return out
}

// sumSamples adds the series with prefix p sample by sample.
func sumSamples(s *Sim, p string, from, to int64) []float64 {
	var out []float64
	for _, n := range s.rec.names() {
		if !hasPrefix(n, p) {
			continue
		}
		for i, v := range samples(s, n, from, to) {
			if i >= len(out) {
				out = append(out, 0)
			}
			out[i] += v
		}
	}
	return out
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// cv is the coefficient of variation (standard deviation / mean).
func cv(v []float64) float64 {
	m := mean(v)
	s := 0.0
	for _, x := range v {
		s += (x - m) * (x - m)
	}
	return math.Sqrt(s/float64(len(v))) / m
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[min(len(c)-1, int(p/100*float64(len(c))))]
}

func dist(v []float64) string {
	return fmt.Sprintf("%.1f / %.1f / %.1f / %.0f%%", 100*mean(v), 100*pct(v, 50), 100*pct(v, 95), 100*slices.Max(v))
}
