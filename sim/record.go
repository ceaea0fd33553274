package sim

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Recorder keeps every time series of a run in fixed sample intervals.
type Recorder struct {
	eng        *Engine
	IntervalNs int64
	series     map[string]*Series
	gauges     []gauge
}

type gauge struct {
	s  *Series
	fn func() float64
}

// Series is one recorded quantity: per sample interval, a sum of values
// and a count (a rate is sum/interval, a mean is sum/count).
type Series struct {
	Name string
	rec  *Recorder
	Sum  []float64
	Cnt  []float64
}

func newRecorder(eng *Engine, intervalNs int64) *Recorder {
	return &Recorder{eng: eng, IntervalNs: intervalNs, series: map[string]*Series{}}
}

// Series returns (creating it) the series called name.
func (r *Recorder) Series(name string) *Series {
	s := r.series[name]
	if s == nil {
		s = &Series{Name: name, rec: r}
		r.series[name] = s
	}
	return s
}

// Gauge samples fn at the end of every interval into the series name.
func (r *Recorder) Gauge(name string, fn func() float64) {
	r.gauges = append(r.gauges, gauge{r.Series(name), fn})
}

func (r *Recorder) startSampling(untilNs int64) {
	var tick func()
	tick = func() {
		for _, g := range r.gauges {
			g.s.addAt(r.eng.NowNs()-1, g.fn(), 1)
		}
		if r.eng.NowNs()+r.IntervalNs <= untilNs {
			r.eng.After(r.IntervalNs, tick)
		}
	}
	r.eng.At(r.IntervalNs, tick)
}

func (s *Series) add(v, c float64) { s.addAt(s.rec.eng.NowNs(), v, c) }

func (s *Series) addAt(atNs int64, v, c float64) {
	if atNs < 0 {
		atNs = 0
	}
	i := int(atNs / s.rec.IntervalNs)
	for len(s.Sum) <= i {
		s.Sum = append(s.Sum, 0)
		s.Cnt = append(s.Cnt, 0)
	}
	s.Sum[i] += v
	s.Cnt[i] += c
}

// window returns the sample index range [a, b) covering [fromNs, toNs).
func (r *Recorder) window(fromNs, toNs int64) (int, int) {
	return int(fromNs / r.IntervalNs), int((toNs + r.IntervalNs - 1) / r.IntervalNs)
}

// SumCount adds sum and count over the samples of [fromNs, toNs).
func (s *Series) SumCount(fromNs, toNs int64) (sum, cnt float64) {
	a, b := s.rec.window(fromNs, toNs)
	for i := a; i < b && i < len(s.Sum); i++ {
		sum += s.Sum[i]
		cnt += s.Cnt[i]
	}
	return
}

// Rate is sum per second over [fromNs, toNs).
func (s *Series) Rate(fromNs, toNs int64) float64 {
	sum, _ := s.SumCount(fromNs, toNs)
	return sum / (float64(toNs-fromNs) / 1e9)
}

// Mean is sum/count over [fromNs, toNs) (0 when nothing was counted).
func (s *Series) Mean(fromNs, toNs int64) float64 {
	sum, cnt := s.SumCount(fromNs, toNs)
	if cnt == 0 {
		return 0
	}
	return sum / cnt
}

// MinRate is the smallest per-interval rate over [fromNs, toNs).
func (s *Series) MinRate(fromNs, toNs int64) float64 {
	a, b := s.rec.window(fromNs, toNs)
	m := -1.0
	iv := float64(s.rec.IntervalNs) / 1e9
	for i := a; i < b; i++ {
		v := 0.0
		if i < len(s.Sum) {
			v = s.Sum[i] / iv
		}
		if m < 0 || v < m {
			m = v
		}
	}
	return m
}

// names returns the series names in order.
func (r *Recorder) names() []string {
	n := make([]string, 0, len(r.series))
	for k := range r.series {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// writeCSV writes one row per sample: time, then per series the rate
// (series whose name starts with a rate prefix) or the mean.
func (r *Recorder) writeCSV(w io.Writer, untilNs int64, record []string) error {
	names := r.names()
	if len(record) > 0 {
		var keep []string
		for _, n := range names {
			for _, want := range record {
				if n == want || (strings.HasSuffix(want, ":") && hasPrefix(n, want)) {
					keep = append(keep, n)
					break
				}
			}
		}
		names = keep
	}
	fmt.Fprint(w, "time_s")
	for _, n := range names {
		fmt.Fprint(w, ",", n)
	}
	fmt.Fprintln(w)
	nb := int(untilNs / r.IntervalNs)
	iv := float64(r.IntervalNs) / 1e9
	for i := 0; i < nb; i++ {
		fmt.Fprint(w, strconv.FormatFloat(float64(i+1)*iv, 'f', -1, 64))
		for _, n := range names {
			s := r.series[n]
			v := 0.0
			if i < len(s.Sum) {
				v = s.value(i, iv)
			}
			fmt.Fprint(w, ",", strconv.FormatFloat(v, 'g', 6, 64))
		}
		fmt.Fprintln(w)
	}
	return nil
}

// value of sample i in the series' display unit.
func (s *Series) value(i int, ivS float64) float64 {
	if isRateSeries(s.Name) {
		return s.Sum[i] / ivS
	}
	if s.Cnt[i] == 0 {
		return 0
	}
	return s.Sum[i] / s.Cnt[i]
}

// Series name prefixes: rates are per second, the others are means.
const (
	prefRate     = "rate_bps:"     // payload bits sent by a port
	prefIOPS     = "iops:"         // I/Os completed by a disk
	prefOrders   = "orders:"       // orders completed by an OLTP workload
	prefLat      = "latency_ms:"   // I/O latency of a disk (mean)
	prefOrderT   = "ordertime_ms:" // order time (mean)
	prefRR       = "rr_us:"        // request/response time (mean)
	prefQDepth   = "qdepth:"       // host window on a datastore (gauge)
	prefDSLat    = "dslat_ms:"     // datastore-wide latency (gauge)
	prefCPU      = "cpu_hz:"       // CPU cycles per second a VM spends sending
	prefEntitled = "ent_bps:"      // entitlement of a port (gauge)
	prefIRQ      = "irq:"          // guest transmit-completion interrupts of a VM
	prefLink     = "link_bps:"     // payload bits/s sent by an uplink
	// The throttle driver's (gauges): a host's budget on a datastore
	// (IOPS; 0: unbounded, SIOC off), its probes' mean latency, the
	// datastore-wide latency its PARDA step saw, and a disk's QEMU
	// throttle (total_iops_sec; 0: none).
	prefBudget   = "budget_iops:"
	prefHostLat  = "hostlat_ms:"
	prefPardaLat = "pardalat_ms:"
	prefThrottle = "throttle_iops:"
)

func isRateSeries(n string) bool {
	return hasPrefix(n, prefRate) || hasPrefix(n, prefIOPS) || hasPrefix(n, prefOrders) || hasPrefix(n, prefCPU) || hasPrefix(n, prefIRQ) || hasPrefix(n, prefLink)
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }
