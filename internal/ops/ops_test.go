package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The endpoints: /metrics in the text format with the build info,
// /healthz always, /readyz by the daemon's check.
func TestHandlerEndpoints(t *testing.T) {
	var notReady error
	reg := NewRegistry("v1.2.3", "0123456789ab", "go1.x")
	s, err := Listen("127.0.0.1:0", Handler(reg, func(context.Context) error { return notReady }, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr()

	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	bi := fams["sluice_build_info"]
	if bi == nil || len(bi.Metric) != 1 || bi.Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("sluice_build_info: %v", bi)
	}
	labels := map[string]string{}
	for _, l := range bi.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != "v1.2.3" || labels["revision"] != "0123456789ab" || labels["goversion"] != "go1.x" {
		t.Errorf("build info labels %v", labels)
	}
	if fams["process_start_time_seconds"] == nil || fams["go_goroutines"] == nil {
		t.Error("no process or Go runtime metrics")
	}

	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz (ready): %d %q", code, body)
	}
	notReady = errors.New("etcd: context deadline\nexceeded")
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: etcd: context deadline exceeded\n" {
		t.Errorf("/readyz (not ready): %d %q", code, body)
	}
	if code, _ := get(t, base+"/other"); code != http.StatusNotFound {
		t.Errorf("/other: %d", code)
	}
}

func TestListenNoneAndBadAddr(t *testing.T) {
	s, err := Listen("", nil)
	if s != nil || err != nil || s.Addr() != "" || s.Close() != nil {
		t.Errorf(`Listen(""): %v %v`, s, err)
	}
	if err := CheckAddr("localhost"); err == nil || !strings.Contains(err.Error(), "want ADDR:PORT") {
		t.Errorf("CheckAddr(localhost): %v", err)
	}
	for _, a := range []string{"", "127.0.0.1:9641", ":9641", "[::1]:0"} {
		if err := CheckAddr(a); err != nil {
			t.Errorf("CheckAddr(%q): %v", a, err)
		}
	}
}

// Every record has its time, level, message and component, in text and
// in JSON; Logf drops the prefix the component already names.
func TestLogger(t *testing.T) {
	var b bytes.Buffer
	l, err := NewLogger(&b, "", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	Logf(l, slog.LevelWarn, "gateway")("gateway: datastore %s: stats volume: %v", "ds1", "EOF")
	line := b.String()
	for _, want := range []string{"time=", "level=WARN", `msg="datastore ds1: stats volume: EOF"`, "component=gateway"} {
		if !strings.Contains(line, want) {
			t.Errorf("text record %q lacks %q", line, want)
		}
	}
	b.Reset()
	if l, err = NewLogger(&b, "json", "agent"); err != nil {
		t.Fatal(err)
	}
	l.Error("step failed", "err", "ClassReplace sl-up0 1:100: EBUSY")
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil {
		t.Fatalf("json record %q: %v", b.String(), err)
	}
	if rec["time"] == nil || rec["level"] != "ERROR" || rec["msg"] != "step failed" || rec["component"] != "agent" {
		t.Errorf("json record %v", rec)
	}
	if _, err := NewLogger(&b, "xml", "agent"); err == nil || err.Error() != `--log-format "xml": want text or json` {
		t.Errorf("xml: %v", err)
	}
}
