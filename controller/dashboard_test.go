package controller

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/agent"
	"sluice/storage"
)

// TestDashboardMetrics: every sluice metric that the Grafana dashboard
// (packaging/grafana/sluice.json) queries is one the agent, the gateway or
// the controller exports (a histogram's _bucket, _sum and _count
// included), and each daemon has at least one panel.
func TestDashboardMetrics(t *testing.T) {
	b, err := os.ReadFile("../packaging/grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	ch := make(chan *prometheus.Desc, 256)
	m := newMetrics()
	collectors := []prometheus.Collector{agent.NewMetrics(), storage.NewMetrics(nil), collector{&Controller{met: m}}}
	for _, c := range collectors {
		c.Describe(ch)
	}
	close(ch)
	name := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		n := name.FindStringSubmatch(d.String())[1]
		known[n] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			known[n+s] = true
		}
	}
	used := map[string]bool{}
	for _, n := range regexp.MustCompile(`sluice_[a-z_]+`).FindAllString(string(b), -1) {
		used[n] = true
	}
	var unknown []string
	daemons := map[string]bool{}
	for n := range used {
		if !known[n] {
			unknown = append(unknown, n)
		}
		daemons[strings.Split(n, "_")[1]] = true
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Errorf("the dashboard queries metrics no daemon exports: %s", strings.Join(unknown, " "))
	}
	for _, d := range []string{"agent", "gateway", "controller"} {
		if !daemons[d] {
			t.Errorf("the dashboard has no panel on the %s", d)
		}
	}
	t.Logf("%d metrics used of %d exported", len(used), len(known)/4)
}
