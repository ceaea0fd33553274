package parda

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs testdata/*.txt. Directives:
//
//	config threshold=DUR [gamma=] [beta-per-share=] [share-term=] [min=] [max=] [period=DUR]
//	update                  input lines: w=W latency=DUR shares=S [peak=N]
//	update-scaled           input lines: w=W latency=DUR shares=S total-shares=S total-window=W [peak=N]
//	                        (peak: the period's peak of outstanding I/Os, applies Hold)
//	latency [fixed=DUR per-kib=DUR ref=BYTES | model=default]
//	                        input lines: NAME ios=N latency=DUR [bytes=BYTES]
//	array slots=N service=DUR [per-kib=DUR] duration=DUR [print-every=DUR] [seed=N] [normalize=off] [law=classic|scaled]
//	                        input lines: NAME shares=S [bytes=BYTES] [window=W]
//	                        and changes: at=DUR NAME shares=S
//
// array runs the controller against the array model (array_test.go) and
// prints a time series, then per phase (between share changes) the settled
// windows, their ratio against the share ratio and the datastore latency
// against the threshold, with violations. Every sample is also checked for
// windows outside [min, max].
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var ctl *Controller
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			a := parseKV(t, d.CmdArgs)
			switch d.Cmd {
			case "config":
				cfg := Config{
					ThresholdNs:  float64(a.dur("threshold", 0)),
					Gamma:        a.float("gamma", 0),
					BetaPerShare: a.float("beta-per-share", 0),
					ShareTerm:    a.float("share-term", 0),
					Min:          a.float("min", 0),
					Max:          a.float("max", 0),
					PeriodNs:     a.dur("period", 0),
				}
				if err := cfg.Validate(); err != nil {
					return "error: " + err.Error()
				}
				ctl = New(cfg)
				c := ctl.Config()
				return fmt.Sprintf("threshold=%gms gamma=%g beta-per-share=%g share-term=%g window=[%g, %g] period=%s",
					c.ThresholdNs/1e6, c.Gamma, c.BetaPerShare, c.ShareTerm, c.Min, c.Max, fmtS(c.PeriodNs))
			case "update", "update-scaled":
				var b strings.Builder
				for _, line := range lines(d.Input) {
					la := parseLine(t, line)
					var w float64
					if d.Cmd == "update" {
						w = ctl.Update(la.float("w", 0), float64(la.dur("latency", 0)), la.float("shares", 0))
					} else {
						w = ctl.UpdateScaled(la.float("w", 0), float64(la.dur("latency", 0)), la.float("shares", 0), la.float("total-shares", 0), la.float("total-window", 0))
					}
					if la.has("peak") {
						w = ctl.Hold(la.float("w", 0), w, int(la.float("peak", 0)))
					}
					fmt.Fprintf(&b, "%s → w=%.3f\n", line, w)
					if c := ctl.Config(); w < c.Min || w > c.Max {
						b.WriteString("  violation: window outside [min, max]\n")
					}
				}
				return b.String()
			case "latency":
				m := DefaultSizeModel
				if a.has("fixed") || a.has("per-kib") {
					m = SizeModel{FixedNs: float64(a.dur("fixed", 0)), NsPerKiB: float64(a.dur("per-kib", 0)), RefBytes: float64(a.bytes("ref", 8<<10))}
				}
				var reports []HostReport
				var b strings.Builder
				for _, line := range lines(d.Input) {
					la := parseLine(t, line)
					r := HostReport{IOs: la.float("ios", 0), LatencyNs: float64(la.dur("latency", 0)), MeanBytes: float64(la.bytes("bytes", 0))}
					reports = append(reports, r)
					fmt.Fprintf(&b, "%s: %.3fms normalised to %.3fms\n", strings.Fields(line)[0], r.LatencyNs/1e6, m.Normalize(r.LatencyNs, r.MeanBytes)/1e6)
				}
				fmt.Fprintf(&b, "datastore %.3fms\n", m.DatastoreLatency(reports)/1e6)
				return b.String()
			case "array":
				return runArrayDirective(t, ctl, a, d.Input)
			}
			t.Fatalf("unknown directive %q", d.Cmd)
			return ""
		})
	})
}

func runArrayDirective(t *testing.T, ctl *Controller, a kv, input string) string {
	arr := arrayModel{slots: a.int("slots", 8), svc: SizeModel{FixedNs: float64(a.dur("service", 5e6)), NsPerKiB: float64(a.dur("per-kib", 0))}}
	// The hosts normalise with the array's own service model.
	norm := arr.svc
	norm.RefBytes = 8 << 10
	if a.str("normalize", "on") == "off" {
		norm = SizeModel{}
	}
	dur := a.dur("duration", 300e9)
	var hosts []*simHost
	idx := map[string]int{}
	var changes []shareChange
	bounds := []int64{0, dur}
	for _, line := range lines(input) {
		la := parseLine(t, line)
		f := strings.Fields(line)
		if la.has("at") {
			name := f[1]
			i, ok := idx[name]
			if !ok {
				t.Fatalf("unknown host %q", name)
			}
			at := la.dur("at", 0)
			changes = append(changes, shareChange{atNs: at, host: i, shares: la.float("shares", 0)})
			bounds = append(bounds, at)
			continue
		}
		idx[f[0]] = len(hosts)
		hosts = append(hosts, &simHost{name: f[0], shares: la.float("shares", 0), bytes: float64(la.bytes("bytes", 8<<10)), window: la.float("window", 32)})
	}
	law := a.str("law", "classic")
	if law != "classic" && law != "scaled" {
		t.Fatalf("law=%s: want classic or scaled", law)
	}
	scaled := law == "scaled"
	samples := runArray(ctl, scaled, arr, norm, hosts, changes, dur, uint64(a.int("seed", 1)))
	var b strings.Builder
	every := a.dur("print-every", 60e9)
	c := ctl.Config()
	for _, s := range samples {
		for _, w := range s.windows {
			if w < c.Min || w > c.Max {
				fmt.Fprintf(&b, "violation: t=%s window %.2f outside [%g, %g]\n", fmtS(s.endNs), w, c.Min, c.Max)
			}
		}
		if s.endNs%every != 0 {
			continue
		}
		fmt.Fprintf(&b, "t=%-5s", fmtS(s.endNs))
		for i, w := range s.windows {
			fmt.Fprintf(&b, " %s=%6.2f", hosts[i].name, w)
		}
		fmt.Fprintf(&b, " latency=%6.2fms iops=%.0f\n", s.latencyNs/1e6, s.iops)
	}
	sortInt64(bounds)
	for i := 0; i+1 < len(bounds); i++ {
		if bounds[i] == bounds[i+1] {
			continue
		}
		phaseSummary(&b, ctl, scaled, arr, hosts, samples, bounds[i], bounds[i+1])
	}
	return b.String()
}

func sortInt64(s []int64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

type kv struct {
	t testing.TB
	m map[string]string
}

func parseKV(t testing.TB, args []datadriven.CmdArg) kv {
	m := map[string]string{}
	for _, a := range args {
		m[a.Key] = strings.Join(a.Vals, ",")
	}
	return kv{t, m}
}

func parseLine(t testing.TB, line string) kv {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return kv{t, m}
}

func (a kv) has(k string) bool { _, ok := a.m[k]; return ok }

func (a kv) str(k, def string) string {
	if v, ok := a.m[k]; ok {
		return v
	}
	return def
}

func (a kv) float(k string, def float64) float64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		a.t.Fatalf("%s=%s: %v", k, v, err)
	}
	return f
}

func (a kv) int(k string, def int) int { return int(a.float(k, float64(def))) }

func (a kv) dur(k string, def int64) int64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	mult := 1.0
	for _, u := range []struct {
		s string
		m float64
	}{{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}} {
		if strings.HasSuffix(v, u.s) {
			v, mult = strings.TrimSuffix(v, u.s), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		a.t.Fatalf("%s: %v", k, err)
	}
	return int64(math.Round(f * mult))
}

func (a kv) bytes(k string, def int64) int64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	mult := 1.0
	for _, u := range []struct {
		s string
		m float64
	}{{"KiB", 1024}, {"MiB", 1 << 20}, {"B", 1}} {
		if strings.HasSuffix(v, u.s) {
			v, mult = strings.TrimSuffix(v, u.s), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		a.t.Fatalf("%s: %v", k, err)
	}
	return int64(f * mult)
}
