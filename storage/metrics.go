package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// DatastoreErrors returns, by datastore, why the gateway does not reach
// it now: its identity is lost or changed (every request fails), or the
// last control period could not read or write its stats volume (it did
// not answer). A datastore it reaches is absent.
func (g *Gateway) DatastoreErrors() map[string]error {
	out := map[string]error{}
	for _, gt := range g.gates {
		gt.mu.Lock()
		switch {
		case gt.failed != nil:
			out[gt.name] = gt.failed
		case gt.statsErr != nil:
			out[gt.name] = fmt.Errorf("stats volume: %w", gt.statsErr)
		}
		gt.mu.Unlock()
	}
	return out
}

// Ready says whether the gateway reaches every datastore it serves
// (DatastoreErrors): nil, or why not, one datastore after another.
func (g *Gateway) Ready(context.Context) error {
	var errs []error
	down := g.DatastoreErrors()
	for _, gt := range g.gates { // in the policy's order
		if err := down[gt.name]; err != nil {
			errs = append(errs, fmt.Errorf("datastore %s: %w", gt.name, err))
		}
	}
	return errors.Join(errs...)
}

// Metrics exports a gateway's status to Prometheus: a scrape reads
// Status() (the last complete control period, and totals since each disk
// was opened) and DatastoreErrors(). Nothing is counted per request
// beyond what the status already keeps.
type Metrics struct {
	g *Gateway

	info, period, last                                                     *prometheus.Desc
	diskEnt, diskRes, diskLim, diskShares, diskIOPS, diskBytes, diskOut    *prometheus.Desc
	diskReads, diskWrites, diskLat, diskFlushFailed                        *prometheus.Desc
	dsUp, dsWindow, dsLat, dsHostLat, dsHostIOPS, dsThresh, dsOut, dsHosts *prometheus.Desc
	dsShares, dsMeasured                                                   *prometheus.Desc
}

// NewMetrics returns the metrics of g, to register in a registry.
func NewMetrics(g *Gateway) *Metrics {
	disk := []string{"disk", "datastore"}
	ds := []string{"datastore"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("sluice_gateway_"+name, help, labels, nil)
	}
	return &Metrics{g: g,
		info:   d("info", "The gateway's host (value 1).", "host"),
		period: d("period_seconds", "Length of the last control period."),
		last:   d("last_period_timestamp_seconds", "End of the last control period (Unix seconds)."),

		diskEnt:         d("disk_entitlement_iops", "What floor semantics (mClock's) give the disk of the IOPS this host completed on its datastore in the last period: max(R, its share), capped by its limit and, when it had no request waiting, by what it completed.", disk...),
		diskRes:         d("disk_reservation_iops", "Reservation of the disk (IOPS).", disk...),
		diskLim:         d("disk_limit_iops", "Limit of the disk (IOPS; absent: unlimited).", disk...),
		diskShares:      d("disk_shares", "Shares of the disk.", disk...),
		diskIOPS:        d("disk_iops", "I/Os the disk completed per second in the last period.", disk...),
		diskBytes:       d("disk_throughput_bytes_per_second", "Bytes the disk transferred per second in the last period.", disk...),
		diskOut:         d("disk_outstanding_requests", "Requests of the disk queued in the gateway or at the datastore at the end of the last period.", disk...),
		diskReads:       d("disk_reads_total", "Reads completed successfully since the gateway opened the disk.", disk...),
		diskWrites:      d("disk_writes_total", "Writes completed successfully since the gateway opened the disk.", disk...),
		diskLat:         d("disk_latency_seconds", "Latency of the disk's requests as the VM sees it (gateway queueing included), since the gateway opened the disk, up to the last period; from the log-linear histograms of the periods (a request may count one bucket late, by up to 12.5% of its latency).", disk...),
		diskFlushFailed: d("disk_flush_failing", "1 when the disk's FLUSHes fail because acknowledged writes may have been lost (see the status's error), else 0.", disk...),

		dsUp:       d("datastore_up", "1 when the gateway reaches the datastore (its identity holds and the last period read and wrote its stats volume), else 0.", ds...),
		dsWindow:   d("datastore_window_requests", "PARDA window: the most requests this host keeps at the datastore.", ds...),
		dsLat:      d("datastore_latency_seconds", "Datastore-wide latency in the last period: IOPS-weighted mean of the hosts' size-normalised device latencies.", ds...),
		dsHostLat:  d("datastore_host_latency_seconds", "This host's size-normalised device latency at the datastore in the last period.", ds...),
		dsHostIOPS: d("datastore_host_iops", "I/Os per second this host completed at the datastore in the last period.", ds...),
		dsThresh:   d("datastore_threshold_seconds", "The datastore's congestion threshold (SIOC; absent without SIOC).", ds...),
		dsOut:      d("datastore_outstanding_requests", "Requests of this host at the datastore.", ds...),
		dsHosts:    d("datastore_hosts", "Hosts with a fresh record in the datastore's stats volume in the last period.", ds...),
		dsShares:   d("datastore_active_shares", "Shares of this host's disks that were active in the last period.", ds...),
		dsMeasured: d("datastore_measured_capacity_iops", "The datastore's capacity as measured: the median of what all hosts did in the last periods (up to 60) in which its latency was at or above the threshold (absent until 5 such periods).", ds...),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.info, m.period, m.last, m.diskEnt, m.diskRes, m.diskLim, m.diskShares,
		m.diskIOPS, m.diskBytes, m.diskOut, m.diskReads, m.diskWrites, m.diskLat, m.diskFlushFailed,
		m.dsUp, m.dsWindow, m.dsLat, m.dsHostLat, m.dsHostIOPS, m.dsThresh, m.dsOut, m.dsHosts, m.dsShares, m.dsMeasured} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	st := m.g.Status()
	down := m.g.DatastoreErrors()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	g(m.info, 1, st.Host)
	g(m.period, st.PeriodS)
	g(m.last, float64(st.TimeUnixNs)/1e9)
	for _, d := range st.Disks {
		l := []string{d.Disk, d.Datastore}
		g(m.diskEnt, d.EntitlementIOPS, l...)
		g(m.diskRes, float64(d.ReservationIOPS), l...)
		if d.LimitIOPS > 0 {
			g(m.diskLim, float64(d.LimitIOPS), l...)
		}
		g(m.diskShares, float64(d.Shares), l...)
		g(m.diskIOPS, d.IOPS, l...)
		g(m.diskBytes, d.MBps*1e6, l...)
		g(m.diskOut, float64(d.Outstanding), l...)
		c(m.diskReads, d.ReadsTotal, l...)
		c(m.diskWrites, d.WritesTotal, l...)
		buckets := make(map[float64]uint64, len(LatencyBoundsS))
		var acc uint64
		for i, le := range LatencyBoundsS {
			acc += d.Latency.Counts[i]
			buckets[le] = acc
		}
		ch <- prometheus.MustNewConstHistogram(m.diskLat, d.Latency.Count, d.Latency.SumS, buckets, l...)
		g(m.diskFlushFailed, b2f(d.Error != ""), l...)
	}
	for _, d := range st.Datastores {
		g(m.dsUp, b2f(down[d.Name] == nil), d.Name)
		g(m.dsWindow, d.Window, d.Name)
		g(m.dsLat, d.DatastoreLatencyMs/1e3, d.Name)
		g(m.dsHostLat, d.HostLatencyMs/1e3, d.Name)
		g(m.dsHostIOPS, d.HostIOPS, d.Name)
		if d.SIOC {
			g(m.dsThresh, d.ThresholdMs/1e3, d.Name)
		}
		g(m.dsOut, float64(d.Outstanding), d.Name)
		g(m.dsHosts, float64(d.HostsSeen), d.Name)
		g(m.dsShares, d.ActiveShares, d.Name)
		if d.MeasuredIOPS > 0 {
			g(m.dsMeasured, d.MeasuredIOPS, d.Name)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
