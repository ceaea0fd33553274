package storage

import (
	"math"
	"testing"
	"time"

	"sluice/parda"
	"sluice/policy"
)

const ms = 1e6 // ns

// rec is a record of host with ios I/Os at latNs each, ending at endNs.
func rec(host string, endNs int64, ios uint64, latNs, window, shares float64) statsRecord {
	return statsRecord{Host: host, PeriodEndNs: endNs, PeriodNs: 1e9, IOs: ios, NormLatSumNs: float64(ios) * latNs, Window: window, ActiveShares: shares}
}

// One control period: the view over fresh records (this host's replaced
// by this period's), the next window and the record to publish.
func TestPardaStep(t *testing.T) {
	const now = int64(100e9)
	sioc := policy.SIOC{Enabled: true, CongestionThreshold: 12 * time.Millisecond}
	def := pardaController(sioc)
	small := sioc
	small.Gamma, small.MinWindow, small.MaxWindow = 1, 8, 64
	custom := pardaController(small)
	for _, tc := range []struct {
		name   string
		ctl    *parda.Controller
		in     periodInput
		window float64 // want
		latMs  float64 // want datastore latency
		hosts  int     // want fresh hosts
	}{
		{name: "no I/O anywhere keeps the window", ctl: def,
			in:     periodInput{Window: 32},
			window: 32, hosts: 1},
		{name: "SIOC off keeps the window", ctl: nil,
			in:     periodInput{IOs: 1000, NormLatSumNs: 1000 * 50 * ms, ActiveShares: 1000, Window: 256},
			window: 256, latMs: 50, hosts: 1},
		{name: "above the threshold the window shrinks", ctl: def,
			// β = 0.3·32, L' = 0.7·12 ms: 0.2·32 + 0.8·(8.4/24·32 + 9.6)
			in:     periodInput{IOs: 1000, NormLatSumNs: 1000 * 24 * ms, ActiveShares: 1000, Window: 32},
			window: 23.04, latMs: 24, hosts: 1},
		{name: "at the threshold with windows in the share ratio nothing moves", ctl: def,
			in: periodInput{IOs: 800, NormLatSumNs: 800 * 12 * ms, ActiveShares: 2000, Window: 20,
				Recs: []statsRecord{rec("h2", now, 1200, 12*ms, 30, 3000)}},
			window: 20, latMs: 12, hosts: 2},
		{name: "below the threshold a filled window grows, at most doubling", ctl: def,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1 * ms, ActiveShares: 1000, Window: 10, Peak: 10},
			window: 20, latMs: 1, hosts: 1},
		{name: "below the threshold a window never filled is kept", ctl: def,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1 * ms, ActiveShares: 1000, Window: 10, Peak: 9},
			window: 10, latMs: 1, hosts: 1},
		{name: "clamped to the maximum", ctl: def,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1 * ms, ActiveShares: 1000, Window: 200, Peak: 200},
			window: 256, latMs: 1, hosts: 1},
		{name: "clamped to the minimum", ctl: def,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1000 * ms, ActiveShares: 1000, Window: 5},
			window: 4, latMs: 1000, hosts: 1},
		{name: "configured maximum", ctl: custom,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1 * ms, ActiveShares: 1000, Window: 60, Peak: 60},
			window: 64, latMs: 1, hosts: 1},
		{name: "configured minimum", ctl: custom,
			in:     periodInput{IOs: 100, NormLatSumNs: 100 * 1000 * ms, ActiveShares: 1000, Window: 10},
			window: 8, latMs: 1000, hosts: 1},
		{name: "own old record replaced, stale host ignored", ctl: def,
			in: periodInput{IOs: 1000, NormLatSumNs: 1000 * 10 * ms, ActiveShares: 1000, Window: 32,
				Recs: []statsRecord{rec("h1", now-1e9, 5000, 500*ms, 99, 9000), rec("h2", now, 3000, 14*ms, 12, 3000), rec("h3", now-10e9, 5000, 100*ms, 50, 1000)}},
			// latency (1000·10 + 3000·14)/4000 = 13 ms; β = 0.3·44·1000/4000
			window: 0.2*32 + 0.8*(8.4/13*32+3.3), latMs: 13, hosts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Host, in.EndNs, in.PeriodNs = "h1", now, 1e9
			out := pardaStep(tc.ctl, in)
			if math.Abs(out.Window-tc.window) > 1e-9 {
				t.Errorf("window %v → %v, want %v", in.Window, out.Window, tc.window)
			}
			if math.Abs(out.View.LatNs/ms-tc.latMs) > 1e-9 || out.View.Hosts != tc.hosts {
				t.Errorf("view %+v, want latency %v ms, %d hosts", out.View, tc.latMs, tc.hosts)
			}
			want := statsRecord{Host: "h1", PeriodEndNs: now, PeriodNs: 1e9, IOs: in.IOs, NormLatSumNs: in.NormLatSumNs, Window: in.Window, ActiveShares: in.ActiveShares}
			if out.Publish != want {
				t.Errorf("publish %+v, want %+v", out.Publish, want)
			}
		})
	}
}

// Hosts with shares 2000 and 3000 on a datastore whose latency is
// outstanding/capacity (Little's law), each running pardaStep on the
// records the others published the period before (each keeps its window
// filled): the windows converge to
// 2:3 and the latency to the threshold, or stop at a configured maximum.
func TestPardaStepConverges(t *testing.T) {
	for _, tc := range []struct {
		name         string
		sioc         policy.SIOC
		ratio, latMs float64 // want
		windows      [2]float64
	}{
		{name: "defaults", sioc: policy.SIOC{CongestionThreshold: 12 * time.Millisecond}, ratio: 1.5, latMs: 12},
		{name: "slow gamma", sioc: policy.SIOC{CongestionThreshold: 12 * time.Millisecond, Gamma: 0.5, ShareTerm: 0.5}, ratio: 1.5, latMs: 12},
		{name: "max window binds", sioc: policy.SIOC{CongestionThreshold: 12 * time.Millisecond, MaxWindow: 8},
			ratio: 1, latMs: 10, windows: [2]float64{8, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const capIOPS = 1600.0
			ctl := pardaController(tc.sioc)
			c := ctl.Config()
			hosts := []string{"h1", "h2"}
			shares := []float64{2000, 3000}
			win := []float64{initialWindow(ctl), initialWindow(ctl)}
			var region []statsRecord
			var latNs float64
			for period := int64(1); period <= 60; period++ {
				W := win[0] + win[1]
				latNs = W / capIOPS * 1e9
				var next []statsRecord
				for i := range hosts {
					ios := uint64(math.Round(capIOPS * win[i] / W))
					out := pardaStep(ctl, periodInput{Host: hosts[i], EndNs: period * 1e9, PeriodNs: 1e9, IOs: ios,
						NormLatSumNs: float64(ios) * latNs, ActiveShares: shares[i], Window: win[i], Peak: int(math.Ceil(win[i])), Recs: region})
					if out.Window < c.Min || out.Window > c.Max {
						t.Fatalf("period %d: %s window %v outside [%v, %v]", period, hosts[i], out.Window, c.Min, c.Max)
					}
					win[i] = out.Window
					next = append(next, out.Publish)
				}
				region = next
			}
			if r := win[1] / win[0]; math.Abs(r-tc.ratio) > 0.01*tc.ratio {
				t.Errorf("windows %.2f, %.2f: ratio %.3f, want %v", win[0], win[1], r, tc.ratio)
			}
			if math.Abs(latNs/ms-tc.latMs) > 0.01*tc.latMs {
				t.Errorf("latency %.2f ms, want %v ms", latNs/ms, tc.latMs)
			}
			if tc.windows != [2]float64{} && (win[0] != tc.windows[0] || win[1] != tc.windows[1]) {
				t.Errorf("windows %v, want %v", win, tc.windows)
			}
		})
	}
}

// The gateway's PARDA takes the datastore's threshold and gains; a policy
// that does not set them gives 0.8, 0.3 and [4, 256], starting at 32.
func TestPardaControllerFromPolicy(t *testing.T) {
	for _, tc := range []struct {
		sioc string
		want parda.Config
		win  float64
	}{
		{sioc: "{enabled: true}", want: parda.Config{ThresholdNs: 30e6, Gamma: 0.8, ShareTerm: 0.3, Min: 4, Max: 256}, win: 32},
		{sioc: "{enabled: true, congestionThreshold: 12ms, gamma: 1, shareTerm: 0.5, minWindow: 40, maxWindow: 64}",
			want: parda.Config{ThresholdNs: 12e6, Gamma: 1, ShareTerm: 0.5, Min: 40, Max: 64}, win: 40},
	} {
		p := parsePolicy(t, "cluster: c\nhosts: [{name: h1, uplinks: [{name: u0, speed: 1Gbps}]}]\ndatastores: [{name: ds1, sioc: "+tc.sioc+"}]\n")
		ctl := pardaController(p.Datastores[0].SIOC)
		got := ctl.Config()
		want := tc.want.WithDefaults()
		if got != want {
			t.Errorf("sioc %s: parda config %+v, want %+v", tc.sioc, got, want)
		}
		if w := initialWindow(ctl); w != tc.win {
			t.Errorf("sioc %s: initial window %v, want %v", tc.sioc, w, tc.win)
		}
	}
}
