package controller

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// VMStates are the states a VM can be in (VMInfo.State).
var VMStates = []string{"running", "starting", "moving", "off", "unknown"}

// metrics are what the controller counts itself (the API requests it
// serves, the events and decisions it commits) and the last etcd check.
type metrics struct {
	requests   *prometheus.CounterVec   // route, code
	latency    *prometheus.HistogramVec // route
	events     *prometheus.CounterVec   // kind
	migrations *prometheus.CounterVec   // status
	decodes    prometheus.Counter       // the stored policy decoded and rebuilt

	// The API's priority levels (fairness.go), by level.
	seats, seatsInUse, waiting *prometheus.GaugeVec
	rejected                   *prometheus.CounterVec // level, reason

	mu        sync.Mutex
	etcdErr   error // of the last check
	etcdAt    time.Time
	etcdTook  time.Duration
	etcdCheck bool // a check ran

	etcdUp, etcdLast, etcdDur, hosts, registered, vms *prometheus.Desc
}

func newMetrics() *metrics {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("sluice_controller_"+name, help, labels, nil)
	}
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controller_api_requests_total",
			Help: "API requests served, by route (METHOD PATTERN; none: refused before routing, e.g. 401) and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_controller_api_request_duration_seconds",
			Help:    "Time to serve an API request, by route (a desired-state long poll waits up to 60 s).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"route"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controller_events_total",
			Help: "Events this controller recorded, by kind (apply, set, power-on, migrate, migrated, fault, recommend, register, observed, off, ...)."}, []string{"kind"}),
		decodes: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_policy_decodes_total",
			Help: "Times the controller decoded the stored policy and replayed its changes: at start and after another controller's change; one per change of its own means its cache misses."}),
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controller_migrations_total",
			Help: "Migration decisions this controller recorded or moved to a status, by that status (recommended, moving, done, failed, superseded)."}, []string{"status"}),
		seats: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_controller_api_seats",
			Help: "Requests the API serves at once, by priority level (hosts: hosts' tokens; operators: operators' tokens)."}, []string{"level"}),
		seatsInUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_controller_api_seats_in_use",
			Help: "Seats of the level taken by requests being served (a long poll holds one only for its first read)."}, []string{"level"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_controller_api_requests_waiting",
			Help: "Requests waiting for a seat of the level, in the queues of their flows (a host, an operator token)."}, []string{"level"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controller_api_requests_rejected_total",
			Help: "Requests refused with 429 for want of a seat, by level and reason (queue-full: their flow's queue was full; wait: no seat came free in time)."}, []string{"level", "reason"}),

		etcdUp:     d("etcd_up", "1 when the last check of etcd (a linearizable read) succeeded, else 0."),
		etcdLast:   d("etcd_last_check_timestamp_seconds", "Time of the last check of etcd (Unix seconds)."),
		etcdDur:    d("etcd_check_duration_seconds", "How long the last check of etcd took."),
		hosts:      d("hosts", "Hosts of the policy in force."),
		registered: d("registered_hosts", "Hosts whose agent holds a live lease."),
		vms:        d("vms", "VMs of the policy by state: running, starting, moving, off, unknown (as ctl get vms shows them).", "state"),
	}
}

// committed counts what one committed decision recorded.
func (m *metrics) committed(n *next) {
	for _, e := range n.events {
		m.events.WithLabelValues(e.Kind).Inc()
	}
	for _, d := range n.decisions {
		m.migrations.WithLabelValues(d.Status).Inc()
	}
	for _, d := range n.rewrites {
		m.migrations.WithLabelValues(d.Status).Inc()
	}
}

// EtcdCheckTimeout bounds one check of etcd.
const EtcdCheckTimeout = 2 * time.Second

// CheckEtcd checks that the controller reaches etcd and etcd serves: a
// linearizable read (it needs the cluster's quorum), within
// EtcdCheckTimeout. The result is the etcd_up metric's.
func (c *Controller) CheckEtcd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, EtcdCheckTimeout)
	defer cancel()
	start := time.Now()
	_, err := c.cfg.Client.Get(ctx, c.key(keySeq), clientv3.WithKeysOnly())
	took := time.Since(start)
	if err != nil {
		err = fmt.Errorf("etcd: %w", err)
	}
	m := c.met
	m.mu.Lock()
	m.etcdErr, m.etcdAt, m.etcdTook, m.etcdCheck = err, c.cfg.Now(), took, true
	m.mu.Unlock()
	return err
}

// Ready says whether the controller can serve: it reaches etcd now
// (CheckEtcd).
func (c *Controller) Ready(ctx context.Context) error { return c.CheckEtcd(ctx) }

// RunHealth checks etcd every interval until ctx ends (the etcd_up
// metric between readiness probes).
func (c *Controller) RunHealth(ctx context.Context, interval time.Duration) {
	_ = c.CheckEtcd(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.CheckEtcd(ctx)
		}
	}
}

// Collector returns the controller's metrics: its counters, the last etcd
// check, and at each scrape the hosts and the VMs by state, read as the
// API reads them (bounded by EtcdCheckTimeout).
func (c *Controller) Collector() prometheus.Collector { return collector{c} }

type collector struct{ c *Controller }

func (k collector) Describe(ch chan<- *prometheus.Desc) {
	m := k.c.met
	m.requests.Describe(ch)
	m.latency.Describe(ch)
	m.events.Describe(ch)
	m.migrations.Describe(ch)
	m.decodes.Describe(ch)
	m.seats.Describe(ch)
	m.seatsInUse.Describe(ch)
	m.waiting.Describe(ch)
	m.rejected.Describe(ch)
	for _, d := range []*prometheus.Desc{m.etcdUp, m.etcdLast, m.etcdDur, m.hosts, m.registered, m.vms} {
		ch <- d
	}
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	c, m := k.c, k.c.met
	m.requests.Collect(ch)
	m.latency.Collect(ch)
	m.events.Collect(ch)
	m.decodes.Collect(ch)
	m.migrations.Collect(ch)
	m.seats.Collect(ch)
	m.seatsInUse.Collect(ch)
	m.waiting.Collect(ch)
	m.rejected.Collect(ch)
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	m.mu.Lock()
	checked, err, at, took := m.etcdCheck, m.etcdErr, m.etcdAt, m.etcdTook
	m.mu.Unlock()
	if checked {
		up := 1.0
		if err != nil {
			up = 0
		}
		g(m.etcdUp, up)
		g(m.etcdLast, float64(at.UnixNano())/1e9)
		g(m.etcdDur, took.Seconds())
	}
	ctx, cancel := context.WithTimeout(context.Background(), EtcdCheckTimeout)
	defer cancel()
	hosts, registered, states, err := c.census(ctx)
	if err != nil {
		for _, d := range []*prometheus.Desc{m.hosts, m.registered, m.vms} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	g(m.hosts, float64(hosts))
	g(m.registered, float64(registered))
	for _, s := range VMStates {
		g(m.vms, float64(states[s]), s)
	}
}

// census counts the policy's hosts, the registered hosts and the
// policy's VMs by state, as VMs and Hosts see them.
func (c *Controller) census(ctx context.Context) (hosts, registered int, states map[string]int, err error) {
	st, err := c.load(ctx)
	if err != nil {
		return 0, 0, nil, err
	}
	reports, err := c.reports(ctx)
	if err != nil {
		return 0, 0, nil, err
	}
	states = map[string]int{}
	if st.p != nil {
		v := c.viewOf(st, reports)
		for i := range st.p.VMs {
			s, _ := v.state(st.p.VMs[i].Name)
			states[s]++
		}
		hosts = len(st.p.Hosts)
	}
	return hosts, len(reports), states, nil
}

// instrument counts and times the requests h serves, by the route the
// API's mux matched (r.Pattern after serving).
func (m *metrics) instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		route := sw.route
		if route == "" {
			route = r.Pattern
		}
		if route == "" {
			route = "none"
		}
		m.requests.WithLabelValues(route, fmt.Sprint(sw.code)).Inc()
		m.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusWriter records the status code a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
	route string // the mux's pattern, when the handler served a copy of the request
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
