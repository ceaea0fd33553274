// Package opstest helps the daemons' tests read what package ops serves:
// /metrics parsed as the Prometheus text format, one sample's value, the
// linter's verdict, the status of /healthz and /readyz.
package opstest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape gets /metrics from h, as Prometheus does (text format), and
// parses it; a response that does not parse fails the test.
func Scrape(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, b)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("/metrics: Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("/metrics does not parse as the Prometheus text format: %v\n%s", err, b)
	}
	return fams
}

// Value is the value of the sample of family name whose labels are
// exactly labels (name, value pairs), and whether there is one. A
// counter or gauge gives its value, a histogram its count.
func (f Families) Value(name string, labels ...string) (float64, bool) {
	m := f.Metric(name, labels...)
	if m == nil {
		return 0, false
	}
	switch f[name].GetType() {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue(), true
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue(), true
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount()), true
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// Metric is the sample of family name with exactly labels, or nil.
func (f Families) Metric(name string, labels ...string) *dto.Metric {
	fam := f[name]
	if fam == nil {
		return nil
	}
	for _, m := range fam.Metric {
		if len(m.Label) != len(labels)/2 {
			continue
		}
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; ok && i+1 < len(labels); i += 2 {
			v, has := got[labels[i]]
			ok = has && v == labels[i+1]
		}
		if ok {
			return m
		}
	}
	return nil
}

// Lint checks the names, types, units and help of what reg gathers with
// Prometheus's linter (promlint) and fails the test for each problem.
// Rates stay in bits/s, as everywhere in sluice and in networking, not
// in the bytes promlint asks for.
func Lint(t testing.TB, reg prometheus.Gatherer) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Text != `use base unit "bytes" instead of "bits"` {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// Get returns the status code and body of GET path on h.
func Get(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}
