package agent

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"sluice/cpuctl"
	"sluice/internal/cputime"
	"sluice/internal/ops"
	"sluice/internal/ops/opstest"
	"sluice/policy"
)

// metricsPolicy: cpuPolicy's host and VMs, vm1's vNIC with a reservation
// and vm3's with a limit, and a vmotion class with a limit.
const metricsPolicy = `cluster: c
hosts: [{name: h1, cpu: {cores: 2, mhz: 1000}, uplinks: [{name: up0, speed: 1Gbps}]}]
trafficClasses:
  vmotion: {shares: normal, limit: 400Mbps}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1, reservationMHz: 700}, nics: [{name: nic0, reservation: 300Mbps}]}
  - {name: vm2, host: h1, cpu: {vcpus: 2, shares: high}, nics: [{name: nic0}]}
  - {name: vm3, host: h1, cpu: {vcpus: 1, limitMHz: 300}, nics: [{name: nic0, limit: 100Mbps}]}
`

// TestMetricsMatchStats: after steps with traffic and CPU use, /metrics
// parses, follows Prometheus's conventions, and every port's and VM's
// values are the agent's own statistics (Stats) in base units.
func TestMetricsMatchStats(t *testing.T) {
	a, _, f := cpuAgent(t, metricsPolicy, true)
	k := a.cfg.Kernel.(*FakeKernel)
	m := NewMetrics()
	clock := time.Unix(100, 0)
	m.Now = func() time.Time { return clock }
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	h := ops.Handler(reg, m.Ready, nil)

	if code, _ := opstest.Get(h, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the first step: %d, want 503", code)
	}
	for i, now := range []int64{1e9, 1.1e9, 1.2e9, 2.3e9} {
		if i > 0 {
			for id, c := range k.Devs["sl-up0"].Classes {
				if c.Parent != 0 && id.Minor() >= 100 {
					_ = k.AddTraffic("sl-up0", id, uint64(i)*1_000_000+uint64(id.Minor())*1000)
				}
			}
			f.SetStats("sl-c-vm2", cpuctl.Stats{UsageNs: uint64(i) * 150e6, RunDelayNs: uint64(i) * 10e6})
			f.SetStats("sl-c-vm3", cpuctl.Stats{UsageNs: uint64(i) * 30e6, NrPeriods: uint64(i), NrThrottled: uint64(i), ThrottledNs: uint64(i) * 70e6})
		}
		_, err := a.Step(now)
		m.Observe(a.Stats(), 3*time.Millisecond, err)
		if err != nil {
			t.Fatal(err)
		}
	}
	s := a.Stats()
	fams := opstest.Scrape(t, h)

	check := func(name string, want float64, labels ...string) {
		t.Helper()
		got, ok := fams.Value(name, labels...)
		if !ok {
			t.Errorf("%s%v: missing", name, labels)
		} else if got != want {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	absent := func(name string, labels ...string) {
		t.Helper()
		if _, ok := fams.Value(name, labels...); ok {
			t.Errorf("%s%v present, want absent", name, labels)
		}
	}
	check("sluice_agent_info", 1, "cluster", "c", "host", "h1", "dynamic", "true")
	check("sluice_agent_last_step_timestamp_seconds", 2.3)
	check("sluice_agent_step_duration_seconds", 4) // the histogram's count
	check("sluice_agent_step_errors_total", 0)
	ports := 0
	for _, u := range s.Uplinks {
		check("sluice_agent_uplink_speed_bits_per_second", 1e9, "uplink", u.Uplink, "dev", u.Dev)
		check("sluice_agent_uplink_usable_bits_per_second", float64(u.UsableBps), "uplink", u.Uplink, "dev", u.Dev)
		for _, p := range u.Ports {
			ports++
			l := []string{"uplink", u.Uplink, "port", p.Port, "class", p.Class}
			check("sluice_agent_port_entitlement_bits_per_second", p.EntitlementBps, l...)
			check("sluice_agent_port_reservation_bits_per_second", p.ReservationBps, l...)
			if p.LimitBps > 0 {
				check("sluice_agent_port_limit_bits_per_second", p.LimitBps, l...)
			} else {
				absent("sluice_agent_port_limit_bits_per_second", l...)
			}
			check("sluice_agent_port_shares", p.Shares, l...)
			check("sluice_agent_port_rate_bits_per_second", p.RateBps, l...)
			check("sluice_agent_port_htb_rate_bits_per_second", float64(p.GuaranteeBps), l...)
			check("sluice_agent_port_htb_ceil_bits_per_second", float64(p.CeilBps), l...)
			check("sluice_agent_port_bytes_total", float64(p.Bytes), l...)
			check("sluice_agent_port_packets_total", float64(p.Packets), l...)
			check("sluice_agent_port_dropped_packets_total", float64(p.Drops), l...)
			check("sluice_agent_port_backlog_packets", float64(p.Queued), l...)
		}
	}
	// The test shows something: traffic measured, entitlements, limits.
	if v, _ := fams.Value("sluice_agent_port_rate_bits_per_second", "uplink", "up0", "port", "vm1/nic0", "class", "vm"); v <= 0 {
		t.Errorf("vm1/nic0's measured rate %v: the test sent no traffic", v)
	}
	check("sluice_agent_port_limit_bits_per_second", 100e6, "uplink", "up0", "port", "vm3/nic0", "class", "vm")
	check("sluice_agent_port_limit_bits_per_second", 400e6, "uplink", "up0", "port", "h1/vmotion", "class", "vmotion")
	check("sluice_agent_port_reservation_bits_per_second", 300e6, "uplink", "up0", "port", "vm1/nic0", "class", "vm")
	if ports < 4 || len(fams["sluice_agent_port_bytes_total"].Metric) != ports {
		t.Errorf("%d ports in the statistics, %d in the metrics", ports, len(fams["sluice_agent_port_bytes_total"].Metric))
	}
	check("sluice_agent_cpu_capacity_hertz", 2000e6)
	for _, c := range s.CPU {
		check("sluice_agent_vm_cpu_entitlement_hertz", c.EntitlementMHz*1e6, "vm", c.VM)
		check("sluice_agent_vm_cpu_reservation_hertz", float64(c.ReservationMHz)*1e6, "vm", c.VM)
		check("sluice_agent_vm_cpu_shares", float64(c.SharesSetting), "vm", c.VM)
		check("sluice_agent_vm_cpu_used_ratio", c.UsedPct/100, "vm", c.VM)
		check("sluice_agent_vm_cpu_throttled_ratio", c.ThrottledPct/100, "vm", c.VM)
		check("sluice_agent_vm_cpu_ready_ratio", c.ReadyPct/100, "vm", c.VM)
	}
	check("sluice_agent_vm_cpu_limit_hertz", 300e6, "vm", "vm3")
	absent("sluice_agent_vm_cpu_limit_hertz", "vm", "vm1")
	if v, _ := fams.Value("sluice_agent_vm_cpu_throttled_ratio", "vm", "vm3"); v <= 0 {
		t.Errorf("vm3 throttled %v: the test throttled nothing", v)
	}

	opstest.Lint(t, reg)

	// Ready while the steps go on; a failed step, or none for 5 s, is not.
	if code, _ := opstest.Get(h, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after steps: %d", code)
	}
	if code, _ := opstest.Get(h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	clock = clock.Add(6 * time.Second)
	if err := m.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "no control step for 6s") {
		t.Errorf("stale: %v", err)
	}
	delete(k.Devs, "sl-up0") // the uplink is gone: the step fails
	_, err := a.Step(2.4e9)
	m.Observe(a.Stats(), time.Millisecond, err)
	if err == nil {
		t.Fatal("a step without the uplink did not fail")
	}
	if code, _ := opstest.Get(h, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after a failed step: %d", code)
	}
	if v, _ := opstest.Scrape(t, h).Value("sluice_agent_step_errors_total"); v != 1 {
		t.Errorf("step errors %v, want 1", v)
	}
}

// BenchmarkStepWithMetrics compares, in one run and interleaved (so
// that the machine's load falls on both alike), a control step of an
// agent with 60 vNICs bare and with metrics: the step's statistics
// handed to Metrics, plus a scrape (Gather and text encoding) every 100
// steps, which is a Prometheus scrape every 10 s at the default 100-ms
// interval. It reports both per step in wall and process CPU time
// (internal/cputime), their ratios, what Observe and one scrape cost, and
// how many samples a scrape has.
func BenchmarkStepWithMetrics(b *testing.B) {
	var yaml strings.Builder
	yaml.WriteString("cluster: c\nhosts: [{name: h1, cpu: {cores: 16, mhz: 2000}, uplinks: [{name: up0, speed: 10Gbps}, {name: up1, speed: 10Gbps}]}]\nvms:\n")
	for i := range 60 {
		yaml.WriteString("  - {name: vm" + strconv.Itoa(i) + ", host: h1, cpu: {vcpus: 1}, nics: [{name: nic0, reservation: 10Mbps}]}\n")
	}
	mk := func() (*Agent, *FakeKernel) {
		p, err := policy.Parse("bench.yaml", []byte(yaml.String()))
		if err != nil {
			b.Fatal(err)
		}
		inv := testInventory(p, "h1")
		k := NewFakeKernel("sl-up0", "sl-up1")
		for _, v := range inv.VNICs {
			k.Devs[v.HostDev] = &FakeDev{}
		}
		a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true})
		if err != nil {
			b.Fatal(err)
		}
		return a, k
	}
	bareA, kb := mk()
	withA, kw := mk()
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	traffic := func(k *FakeKernel, i int) {
		for _, dev := range []string{"sl-up0", "sl-up1"} {
			for id, c := range k.Devs[dev].Classes {
				if id.Minor() >= 100 && c.Parent != 0 {
					_ = k.AddTraffic(dev, id, uint64(1_000_000+i*int(id.Minor())))
				}
			}
		}
	}
	series := 0
	scrapeOnce := func() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		series = 0
		for _, mf := range mfs {
			series += len(mf.Metric)
		}
		enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				b.Fatal(err)
			}
		}
	}
	now := int64(1e9)
	for range 15 { // past the first demand window: the steps decide
		now += 1e8
		traffic(kb, 1)
		traffic(kw, 1)
		if _, err := bareA.Step(now); err != nil {
			b.Fatal(err)
		}
		_, err := withA.Step(now)
		m.Observe(withA.Stats(), time.Millisecond, err)
	}
	runtime.GC()
	// Wall and process CPU time (getrusage: on this shared machine wall
	// time also counts waiting for a CPU) of each part.
	type cost struct{ wall, cpu int64 }
	var bare, step, observe, scrape cost
	clock := func() cost { return cost{time.Now().UnixNano(), cputime.ProcessNs()} }
	add := func(c *cost, from, to cost) { c.wall += to.wall - from.wall; c.cpu += to.cpu - from.cpu }
	scrapes := 0
	b.ResetTimer()
	for i := range b.N {
		now += 1e8
		traffic(kb, i)
		traffic(kw, i)
		c0 := clock()
		if _, err := bareA.Step(now); err != nil {
			b.Fatal(err)
		}
		c1 := clock()
		_, err := withA.Step(now)
		c2 := clock()
		m.Observe(withA.Stats(), time.Duration(c2.wall-c1.wall), err)
		c3 := clock()
		add(&bare, c0, c1)
		add(&step, c1, c2)
		add(&observe, c2, c3)
		if i%100 == 0 {
			scrapeOnce()
			add(&scrape, c3, clock())
			scrapes++
		}
	}
	b.StopTimer()
	n := float64(b.N)
	with := cost{step.wall + observe.wall + scrape.wall, step.cpu + observe.cpu + scrape.cpu}
	b.ReportMetric(float64(bare.wall)/n, "bare-ns/step")
	b.ReportMetric(float64(with.wall)/n, "metrics-ns/step")
	b.ReportMetric(float64(with.wall)/float64(bare.wall), "ratio")
	b.ReportMetric(float64(bare.cpu)/n, "bare-cpu-ns/step")
	b.ReportMetric(float64(with.cpu)/n, "metrics-cpu-ns/step")
	b.ReportMetric(float64(with.cpu)/float64(bare.cpu), "cpu-ratio")
	b.ReportMetric(float64(observe.wall)/n, "observe-ns")
	b.ReportMetric(float64(scrape.wall)/float64(scrapes), "scrape-ns")
	b.ReportMetric(float64(scrape.cpu)/float64(scrapes), "scrape-cpu-ns")
	b.ReportMetric(float64(series), "series")
}
