package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exports an agent's statistics to Prometheus. The run loop hands
// it each step's Stats (Observe); a scrape reads the last ones (Collect).
// The values are those of the statistics file and `sluice agent status`,
// converted to base units (bits/s, Hz, ratios of one core) and nothing
// recomputed; nothing is done per packet, and a step costs one copy of a
// struct under a lock.
type Metrics struct {
	// Now is the clock of readiness (nil: time.Now).
	Now func() time.Time
	// StaleAfter is how long after the last step the agent counts as not
	// ready (its loop is stuck); 0 means 5 s.
	StaleAfter time.Duration

	mu      sync.Mutex
	stats   Stats
	steps   int
	lastErr error
	lastAt  time.Time

	step   prometheus.Histogram
	errors prometheus.Counter

	info, upSpeed, upUsable                                       *prometheus.Desc
	portEnt, portRes, portLim, portShares, portRate, portHTB      *prometheus.Desc
	portCeil, portBytes, portPackets, portDrops, portBacklog      *prometheus.Desc
	unnamed, lastStep, cpuCap                                     *prometheus.Desc
	cpuEnt, cpuRes, cpuLim, cpuShares, cpuUsed, cpuThrot, cpuRead *prometheus.Desc
	nicInfo, nicSpeed, nicQueues, nicChannels, nicChannelsMax     *prometheus.Desc
	nicOffload, nicWarnings                                       *prometheus.Desc
}

// NewMetrics returns the agent's metrics, empty until the first Observe.
func NewMetrics() *Metrics {
	port := []string{"uplink", "port", "class"}
	up := []string{"uplink", "dev"}
	vm := []string{"vm"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("sluice_agent_"+name, help, labels, nil)
	}
	return &Metrics{
		step: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_agent_step_duration_seconds",
			Help:    "Duration of a control step (measure, decide, apply), from its tick to its end.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14)}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_agent_step_errors_total",
			Help: "Control steps that reported an error (a kernel operation failed, a new policy was refused)."}),

		info:     d("info", "The agent's cluster, host and mode (value 1).", "cluster", "host", "dynamic"),
		upSpeed:  d("uplink_speed_bits_per_second", "Line rate of the uplink (the HTB root's rate).", "uplink", "dev"),
		upUsable: d("uplink_usable_bits_per_second", "Payload capacity of the uplink that alloc divides.", "uplink", "dev"),

		portEnt:     d("port_entitlement_bits_per_second", "Entitlement of the port (vNIC VM/NIC or traffic class HOST/CLASS) from alloc on measured demand, payload.", port...),
		portRes:     d("port_reservation_bits_per_second", "Reservation of the port in force here, payload.", port...),
		portLim:     d("port_limit_bits_per_second", "Limit of the port in force here, payload (absent: unlimited).", port...),
		portShares:  d("port_shares", "Shares of the port in force here.", port...),
		portRate:    d("port_rate_bits_per_second", "Measured rate of the port's class on the wire, smoothed over the last intervals.", port...),
		portHTB:     d("port_htb_rate_bits_per_second", "HTB rate (guarantee) set on the port's class, wire.", port...),
		portCeil:    d("port_htb_ceil_bits_per_second", "HTB ceil set on the port's class, wire.", port...),
		portBytes:   d("port_bytes_total", "Bytes the port's class sent (kernel counter; restarts when the class is re-created).", port...),
		portPackets: d("port_packets_total", "Packets the port's class sent (kernel counter).", port...),
		portDrops:   d("port_dropped_packets_total", "Packets the port's class dropped (kernel counter).", port...),
		portBacklog: d("port_backlog_packets", "Packets waiting in the port's class queue when read: above 0 the port asked for more than it got.", port...),

		unnamed:  d("unnamed_vms", "Running VMs the policy does not name (each vNIC gets the policy's unnamedVMs setting)."),
		lastStep: d("last_step_timestamp_seconds", "Time of the last control step (Unix seconds)."),
		cpuCap:   d("cpu_capacity_hertz", "CPU the VMs share: the policy's cores × MHz of the host (agent --cpu)."),

		cpuEnt:    d("vm_cpu_entitlement_hertz", "CPU entitlement of the VM (agent --cpu).", vm...),
		cpuRes:    d("vm_cpu_reservation_hertz", "CPU reservation of the VM in force here.", vm...),
		cpuLim:    d("vm_cpu_limit_hertz", "CPU limit of the VM in force here (absent: unlimited).", vm...),
		cpuShares: d("vm_cpu_shares", "CPU shares of the VM in force here.", vm...),
		cpuUsed:   d("vm_cpu_used_ratio", "CPU the VM used over the last interval, in cores (1 = one core busy).", vm...),
		cpuThrot:  d("vm_cpu_throttled_ratio", "Time the VM's group was throttled per wall time over the last interval.", vm...),
		cpuRead:   d("vm_cpu_ready_ratio", "Run-queue wait of the VM's threads per wall time over the last interval (esxtop %RDY / 100).", vm...),

		nicInfo:        d("uplink_nic_info", "The uplink's NIC: its driver and the root qdisc sluice replaced (value 1).", "uplink", "dev", "driver", "root_before"),
		nicSpeed:       d("uplink_nic_speed_bits_per_second", "Link speed the uplink's driver reports (absent: unknown); the policy's speed is the HTB root's.", up...),
		nicQueues:      d("uplink_nic_queues", "Transmit (direction tx) and receive (rx) queues of the uplink's device.", "uplink", "dev", "direction"),
		nicChannels:    d("uplink_nic_channels", "Channels of the uplink's NIC in use, by kind (rx, tx, other, combined; ethtool -l; absent: unknown).", "uplink", "dev", "kind"),
		nicChannelsMax: d("uplink_nic_channels_max", "Most channels of the kind the uplink's NIC can have (ethtool -l's pre-set maximum).", "uplink", "dev", "kind"),
		nicOffload:     d("uplink_nic_offload_enabled", "1 when the offload (tso, gso, gro, lro, rx and tx checksums; ethtool -k) is on on the uplink's NIC, else 0.", "uplink", "dev", "offload"),
		nicWarnings:    d("uplink_nic_warnings", "Warnings about the uplink's NIC (an offload off that costs CPU per Gbps, a link slower than the policy's speed, an mq root replaced by one HTB); agent status lists them.", up...),
	}
}

// Observe takes one step's statistics, its duration and its error (what
// Run reports).
func (m *Metrics) Observe(s Stats, step time.Duration, err error) {
	m.step.Observe(step.Seconds())
	if err != nil {
		m.errors.Inc()
	}
	now := m.now()
	m.mu.Lock()
	m.stats, m.lastErr, m.lastAt = s, err, now
	m.steps++
	m.mu.Unlock()
}

func (m *Metrics) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Ready says whether the agent enforces: it has applied its trees (a step
// ended without error) and its last step is recent.
func (m *Metrics) Ready(context.Context) error {
	m.mu.Lock()
	steps, err, at := m.steps, m.lastErr, m.lastAt
	m.mu.Unlock()
	stale := m.StaleAfter
	if stale <= 0 {
		stale = 5 * time.Second
	}
	switch {
	case steps == 0:
		return errors.New("no control step yet")
	case err != nil:
		return fmt.Errorf("last step: %w", err)
	case m.now().Sub(at) > stale:
		return fmt.Errorf("no control step for %v", m.now().Sub(at).Round(time.Millisecond))
	}
	return nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.step.Desc()
	ch <- m.errors.Desc()
	for _, d := range []*prometheus.Desc{m.info, m.upSpeed, m.upUsable, m.portEnt, m.portRes, m.portLim, m.portShares,
		m.portRate, m.portHTB, m.portCeil, m.portBytes, m.portPackets, m.portDrops, m.portBacklog, m.unnamed, m.lastStep,
		m.cpuCap, m.cpuEnt, m.cpuRes, m.cpuLim, m.cpuShares, m.cpuUsed, m.cpuThrot, m.cpuRead,
		m.nicInfo, m.nicSpeed, m.nicQueues, m.nicChannels, m.nicChannelsMax, m.nicOffload, m.nicWarnings} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last step's statistics.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	ch <- m.step
	ch <- m.errors
	m.mu.Lock()
	s, steps := m.stats, m.steps
	m.mu.Unlock()
	if steps == 0 {
		return
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	g(m.info, 1, s.Cluster, s.Host, strconv.FormatBool(s.Dynamic))
	g(m.lastStep, float64(s.NowNs)/1e9)
	g(m.unnamed, float64(len(s.Unnamed)))
	for _, u := range s.Uplinks {
		up := u.Label()
		g(m.upSpeed, float64(u.SpeedBps), up, u.Dev)
		g(m.upUsable, float64(u.UsableBps), up, u.Dev)
		if u.NIC != nil {
			m.collectNIC(ch, up, u.Dev, u.NIC)
		}
		for _, p := range u.Ports {
			l := []string{up, p.Port, p.Class}
			g(m.portEnt, p.EntitlementBps, l...)
			g(m.portRes, p.ReservationBps, l...)
			if p.LimitBps > 0 {
				g(m.portLim, p.LimitBps, l...)
			}
			g(m.portShares, p.Shares, l...)
			g(m.portRate, p.RateBps, l...)
			g(m.portHTB, float64(p.GuaranteeBps), l...)
			g(m.portCeil, float64(p.CeilBps), l...)
			c(m.portBytes, p.Bytes, l...)
			c(m.portPackets, p.Packets, l...)
			c(m.portDrops, p.Drops, l...)
			g(m.portBacklog, float64(p.Queued), l...)
		}
	}
	if len(s.CPU) > 0 {
		g(m.cpuCap, s.CPUCapacityMHz*1e6)
	}
	for _, v := range s.CPU {
		g(m.cpuEnt, v.EntitlementMHz*1e6, v.VM)
		g(m.cpuRes, float64(v.ReservationMHz)*1e6, v.VM)
		if v.LimitMHz > 0 {
			g(m.cpuLim, float64(v.LimitMHz)*1e6, v.VM)
		}
		g(m.cpuShares, float64(v.SharesSetting), v.VM)
		g(m.cpuUsed, v.UsedPct/100, v.VM)
		g(m.cpuThrot, v.ThrottledPct/100, v.VM)
		g(m.cpuRead, v.ReadyPct/100, v.VM)
	}
}

// collectNIC exports what the agent read of an uplink's NIC; what is
// unknown is absent.
func (m *Metrics) collectNIC(ch chan<- prometheus.Metric, uplink, dev string, n *UplinkNIC) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(m.nicInfo, 1, uplink, dev, n.Driver, n.RootBefore)
	if n.SpeedBps > 0 {
		g(m.nicSpeed, float64(n.SpeedBps), uplink, dev)
	}
	g(m.nicQueues, float64(n.TxQueues), uplink, dev, "tx")
	g(m.nicQueues, float64(n.RxQueues), uplink, dev, "rx")
	if c := n.Channels; c != nil {
		for _, k := range []struct {
			kind     string
			cur, max uint32
		}{{"rx", c.RX, c.MaxRX}, {"tx", c.TX, c.MaxTX}, {"other", c.Other, c.MaxOther}, {"combined", c.Combined, c.MaxCombined}} {
			if k.max > 0 {
				g(m.nicChannels, float64(k.cur), uplink, dev, k.kind)
				g(m.nicChannelsMax, float64(k.max), uplink, dev, k.kind)
			}
		}
	}
	for _, o := range n.Offloads {
		v := 0.0
		if o.On {
			v = 1
		}
		g(m.nicOffload, v, uplink, dev, o.Name)
	}
	g(m.nicWarnings, float64(len(n.Warnings)), uplink, dev)
}
