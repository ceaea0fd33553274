package controller

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/ops"
	"sluice/internal/ops/opstest"
)

// TestMetricsMatchAPI: after an apply, two registrations, a set that
// faults, an approval and a power-on, the controller's /metrics parses,
// passes the linter and says what its API says: events by kind, VMs by
// state, hosts, registered hosts, the migrations' statuses, requests by
// route and code; /readyz and /healthz answer.
func TestMetricsMatchAPI(t *testing.T) {
	f := newFixture(t, true)
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.c.Collector())
	h := ops.Handler(reg, f.c.Ready, nil)

	f.apply(offDoc(t))
	if _, err := f.cl.Register(f.ctx, "h1", Report{VMs: []string{"vm1", "vm2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Register(f.ctx, "h2", Report{VMs: []string{}}); err != nil {
		t.Fatal(err)
	}
	// Fig. 2 step b: a fault, placement recommends moving vm2; approved.
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm2/nic0.reservation=4.5Gbps"}}); err != nil {
		t.Fatal(err)
	}
	ds, err := f.cl.Decisions(f.ctx)
	if err != nil || len(ds) != 1 {
		t.Fatalf("decisions %+v %v", ds, err)
	}
	if _, err := f.cl.Approve(f.ctx, ds[0].Seq, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.PowerOn(f.ctx, "vm3", PowerOnRequest{Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	bad := &Client{Server: f.cl.Server, Token: "not-the-token-0123456789", HTTP: f.cl.HTTP}
	if _, err := bad.VMs(f.ctx); StatusOf(err) != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v", err)
	}

	vms, err := f.cl.VMs(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := f.cl.Hosts(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, err := f.cl.Events(f.ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	fams := opstest.Scrape(t, h)
	opstest.Lint(t, reg)
	check := func(name string, want float64, labels ...string) {
		t.Helper()
		got, ok := fams.Value(name, labels...)
		if !ok {
			t.Errorf("%s%v: missing", name, labels)
		} else if got != want {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	states := map[string]int{}
	for _, v := range vms {
		states[v.State]++
	}
	if states["running"] != 1 || states["moving"] != 1 || states["starting"] != 1 || states["off"] != 1 {
		t.Errorf("the test shows little: VMs by state %v", states)
	}
	for _, s := range VMStates {
		check("sluice_controller_vms", float64(states[s]), "state", s)
	}
	registered := 0
	for _, h := range hosts {
		if h.Registered {
			registered++
		}
	}
	check("sluice_controller_hosts", float64(len(hosts)))
	check("sluice_controller_registered_hosts", float64(registered))
	kinds := map[string]int{}
	for _, e := range events {
		kinds[e.Kind]++
	}
	if len(kinds) < 4 {
		t.Errorf("the test shows little: events %v", kinds)
	}
	for k, n := range kinds {
		check("sluice_controller_events_total", float64(n), "kind", k)
	}
	if n := len(fams["sluice_controller_events_total"].GetMetric()); n != len(kinds) {
		t.Errorf("%d event kinds in the metrics, %d in the API", n, len(kinds))
	}
	check("sluice_controller_migrations_total", 1, "status", "recommended")
	check("sluice_controller_migrations_total", 1, "status", "moving")
	check("sluice_controller_api_requests_total", 1, "route", "POST /v1/policy", "code", "200")
	check("sluice_controller_api_requests_total", 2, "route", "POST /v1/hosts/{host}/register", "code", "200")
	check("sluice_controller_api_requests_total", 1, "route", "POST /v1/decisions/{seq}/approve", "code", "200")
	check("sluice_controller_api_requests_total", 1, "route", "none", "code", "401")
	check("sluice_controller_api_request_duration_seconds", 1, "route", "POST /v1/set")
	// etcd's health is known once checked (a readiness probe, RunHealth).
	if _, ok := fams.Value("sluice_controller_etcd_up"); ok {
		t.Error("etcd_up before any check")
	}
	if code, body := opstest.Get(h, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d %s", code, body)
	}
	if code, _ := opstest.Get(h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if v, ok := opstest.Scrape(t, h).Value("sluice_controller_etcd_up"); !ok || v != 1 {
		t.Errorf("etcd_up after a check: %v (%v), want 1", v, ok)
	}
}

// TestHealthEtcdLost: a controller on an etcd of its own is ready and
// says etcd is up; once that etcd stops, /readyz answers 503 with the
// reason, etcd_up is 0 and /healthz still answers.
func TestHealthEtcdLost(t *testing.T) {
	e, err := OpenEtcd(EtcdConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			e.Embedded.Close()
		}
		e.Client.Close()
	}()
	c := New(Config{Client: e.Client})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.Collector())
	h := ops.Handler(reg, c.Ready, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.RunHealth(ctx, time.Hour) // one check at once
	if code, body := opstest.Get(h, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if v, ok := opstest.Scrape(t, h).Value("sluice_controller_etcd_up"); !ok || v != 1 {
		t.Errorf("etcd_up %v (%v), want 1", v, ok)
	}
	e.Embedded.Close() // etcd stops; the controller's client stays
	stopped = true
	start := time.Now()
	code, body := opstest.Get(h, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: etcd: ") {
		t.Errorf("/readyz with etcd stopped: %d %q", code, body)
	}
	if took := time.Since(start); took > EtcdCheckTimeout+time.Second {
		t.Errorf("/readyz took %v", took)
	}
	fams := opstest.Scrape(t, h)
	if v, ok := fams.Value("sluice_controller_etcd_up"); !ok || v != 0 {
		t.Errorf("etcd_up %v (%v) with etcd stopped, want 0", v, ok)
	}
	if code, _ := opstest.Get(h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with etcd stopped: %d", code)
	}
}

// An embedded member stopped cleanly (Etcd.Close) logs no error: etcd's
// complaints about its own listeners closing are dropped.
func TestEtcdQuietOnCleanStop(t *testing.T) {
	dir := t.TempDir()
	e, err := OpenEtcd(EtcdConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
	e.Close()
	b, err := os.ReadFile(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, "due to error") {
			t.Errorf("etcd.log after a clean stop: %s", line)
		}
	}
}
