// Package top is `sluice top`: a live terminal view of one host, like
// esxtop, or of the whole cluster as the controller sees it. Per VM and vNIC (and per host traffic class) it shows the
// entitlement against the measured rate, the VM's CPU (used, throttled,
// ready) and its disks' IOPS, sortable, with the reasons of the selected
// row. It reads what the host's daemons publish (the agent's statistics
// file, the gateways' status files) through a Load function and renders
// text; it changes nothing, and the view is a pure function of a Snapshot.
package top

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"sluice/agent"
	"sluice/storage"
)

// Snapshot is what one refresh read: a host's agent statistics and
// gateways, or (Controller set) the controller's view of the cluster.
type Snapshot struct {
	// Agent is the agent's last statistics (nil when unreadable: Err).
	Agent *agent.Stats
	// Controller is the controller's URL when the snapshot is its view:
	// Ports then holds every port's last reported rate.
	Controller string
	Ports      []PortSample
	// Gateways are the host's gateways' status (disks); none is fine.
	Gateways []storage.Status
	// Err is why the agent's statistics could not be read.
	Err error
	// At is when the snapshot was read.
	At time.Time
}

// PortSample is a port's last report through the controller: the rate
// its host's agent measured and the entitlement of the host's desired
// state then.
type PortSample struct {
	Host, Port               string
	EntitledBps, MeasuredBps float64
	At                       time.Time
}

// Row is one line of the view: a vNIC (Port VM/NIC) or a host traffic
// class (HOST/CLASS), or a VM with no vNIC on a tree (Port "-"). Rates are
// payload bits/s, comparable with the entitlement; CPU in percent of one
// core; the VM's CPU and disk columns repeat on each of its vNICs.
type Row struct {
	VM, Port, Uplink string
	EntitledBps      float64
	RateBps          float64 // measured, payload (wire rate × usable / speed)
	ReservationBps   float64
	LimitBps         float64 // 0: unlimited
	Shares           float64
	Backlog          uint64
	Drops            uint64
	HasCPU           bool
	CPUEntitledMHz   float64
	CPUUsedPct       float64
	CPUThrottledPct  float64
	CPUReadyPct      float64
	CPUReason        string
	Disks            int
	IOPS             float64
	IOPSEntitled     float64
	DiskLatencyMs    float64   // the busiest disk's mean latency
	At               time.Time // the controller's view: when the port's host reported
}

// RatePct is the measured rate in percent of the entitlement (0 when
// nothing is entitled).
func (r Row) RatePct() float64 {
	if r.EntitledBps <= 0 {
		return 0
	}
	return 100 * r.RateBps / r.EntitledBps
}

// Rows derives the view's rows from a snapshot, in the agent's order
// (the controller's view: in its order, one row per port, Uplink holding
// the port's host).
func Rows(s Snapshot) []Row {
	var rows []Row
	if s.Controller != "" {
		for _, p := range s.Ports {
			vm, _, _ := strings.Cut(p.Port, "/")
			rows = append(rows, Row{VM: vm, Port: p.Port, Uplink: p.Host, EntitledBps: p.EntitledBps, RateBps: p.MeasuredBps, At: p.At})
		}
		return rows
	}
	if s.Agent == nil {
		return nil
	}
	cpu := map[string]agent.CPUStat{}
	for _, c := range s.Agent.CPU {
		cpu[c.VM] = c
	}
	type disk struct {
		n              int
		iops, ent, lat float64
		busiest        float64
	}
	disks := map[string]*disk{}
	for _, g := range s.Gateways {
		for _, d := range g.Disks {
			vm, _, _ := strings.Cut(d.Disk, "/")
			x := disks[vm]
			if x == nil {
				x = &disk{}
				disks[vm] = x
			}
			x.n++
			x.iops += d.IOPS
			x.ent += d.EntitlementIOPS
			if d.IOPS >= x.busiest {
				x.busiest, x.lat = d.IOPS, d.LatencyMeanMs
			}
		}
	}
	fill := func(r *Row) {
		if c, ok := cpu[r.VM]; ok {
			r.HasCPU, r.CPUEntitledMHz, r.CPUUsedPct, r.CPUThrottledPct, r.CPUReadyPct, r.CPUReason = true, c.EntitlementMHz, c.UsedPct, c.ThrottledPct, c.ReadyPct, c.Reason
		}
		if d := disks[r.VM]; d != nil {
			r.Disks, r.IOPS, r.IOPSEntitled, r.DiskLatencyMs = d.n, d.iops, d.ent, d.lat
		}
	}
	seen := map[string]bool{}
	for _, u := range s.Agent.Uplinks {
		if u.Direction == "inbound" {
			continue // top shows what the ports send
		}
		scale := 1.0
		if u.SpeedBps > 0 && u.UsableBps > 0 {
			scale = float64(u.UsableBps) / float64(u.SpeedBps)
		}
		for _, p := range u.Ports {
			vm, _, _ := strings.Cut(p.Port, "/")
			r := Row{VM: vm, Port: p.Port, Uplink: u.Uplink, EntitledBps: p.EntitlementBps, RateBps: p.RateBps * scale,
				ReservationBps: p.ReservationBps, LimitBps: p.LimitBps, Shares: p.Shares, Backlog: p.Queued, Drops: p.Drops}
			fill(&r)
			seen[vm] = true
			rows = append(rows, r)
		}
	}
	var rest []string
	for vm := range cpu {
		if !seen[vm] {
			rest = append(rest, vm)
		}
	}
	for vm := range disks {
		if !seen[vm] && cpu[vm].VM == "" {
			rest = append(rest, vm)
		}
	}
	sort.Strings(rest)
	for _, vm := range rest {
		r := Row{VM: vm, Port: "-"}
		fill(&r)
		rows = append(rows, r)
	}
	return rows
}

// Column is a sort key of the view.
type Column int

// The columns top sorts by (keys n, e, r, p, c, y, t, i).
const (
	ByName Column = iota
	ByEntitled
	ByRate
	ByRatePct
	ByCPU
	ByReady
	ByThrottled
	ByIOPS
	numColumns
)

var columnNames = [...]string{"name", "entitled", "rate", "%ent", "cpu", "ready", "throttled", "iops"}

func (c Column) String() string { return columnNames[c] }

// ColumnByKey is the column a key sorts by.
var ColumnByKey = map[string]Column{"n": ByName, "e": ByEntitled, "r": ByRate, "p": ByRatePct, "c": ByCPU, "y": ByReady, "t": ByThrottled, "i": ByIOPS}

// Sort orders rows by c: names ascending, numbers descending (the
// busiest first); ties by name.
func Sort(rows []Row, c Column) {
	key := func(r Row) float64 {
		switch c {
		case ByEntitled:
			return r.EntitledBps
		case ByRate:
			return r.RateBps
		case ByRatePct:
			return r.RatePct()
		case ByCPU:
			return r.CPUUsedPct
		case ByReady:
			return r.CPUReadyPct
		case ByThrottled:
			return r.CPUThrottledPct
		case ByIOPS:
			return r.IOPS
		}
		return 0
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if c != ByName {
			if a, b := key(rows[i]), key(rows[j]); a != b {
				return a > b
			}
		}
		return rows[i].Port < rows[j].Port || rows[i].Port == rows[j].Port && rows[i].VM < rows[j].VM
	})
}

// View is the state of the screen: the sort column and the selected row.
type View struct {
	Sort     Column
	Selected int
	Width    int // 0: 120
	Height   int // 0: no limit
}

// Render draws a snapshot: a header, one line per row (sorted), the
// reasons of the selected row and the keys.
func Render(s Snapshot, v View) string {
	var b strings.Builder
	width := v.Width
	if width <= 0 {
		width = 120
	}
	line := func(format string, a ...any) {
		l := fmt.Sprintf(format, a...)
		if r := []rune(l); len(r) > width {
			l = string(r[:width])
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	head := 0 // lines above the table
	switch {
	case s.Controller != "" && s.Err != nil:
		line("sluice top  controller %s  %s", s.Controller, s.At.Format("15:04:05"))
		line("no view from the controller: %v", s.Err)
		line("q quit")
		return b.String()
	case s.Controller != "":
		hosts := map[string]bool{}
		for _, p := range s.Ports {
			hosts[p.Host] = true
		}
		line("sluice top  controller %s  %d ports on %d hosts reporting  sort: %s", s.Controller, len(s.Ports), len(hosts), v.Sort)
		head = 1
	case s.Agent == nil:
		line("sluice top  %s", s.At.Format("15:04:05"))
		line("no agent statistics: %v", s.Err)
		line("q quit")
		return b.String()
	default:
		a := s.Agent
		age := s.At.Sub(time.Unix(0, a.NowNs)).Round(100 * time.Millisecond)
		line("sluice top  host %s  cluster %s  dynamic=%v  agent step %s ago  sort: %s", a.Host, a.Cluster, a.Dynamic, age, v.Sort)
		for _, u := range a.Uplinks {
			line("uplink %s (%s)  speed %s  usable %s", u.Label(), u.Dev, mbps(float64(u.SpeedBps)), mbps(float64(u.UsableBps)))
		}
		head = 1 + len(a.Uplinks)
	}
	rows := Rows(s)
	Sort(rows, v.Sort)
	line("")
	where := "UPLINK"
	if s.Controller != "" {
		where = "HOST"
	}
	line("%-14s %-18s %-7s %10s %10s %6s %6s %7s %7s %7s %6s %8s %8s", "VM", "PORT", where, "ENT Mbps", "RATE Mbps", "%ENT", "QUEUE", "CPU %", "RDY %", "THR %", "DISKS", "IOPS", "IOPS ENT")
	sel := v.Selected
	if sel >= len(rows) {
		sel = len(rows) - 1
	}
	max := len(rows)
	if v.Height > 0 {
		max = min(max, v.Height-head-7)
	}
	for i, r := range rows {
		if i >= max {
			line("… %d more rows", len(rows)-i)
			break
		}
		mark := " "
		if i == sel {
			mark = ">"
		}
		cpu, rdy, thr := "-", "-", "-"
		if r.HasCPU {
			cpu, rdy, thr = fmt.Sprintf("%.1f", r.CPUUsedPct), fmt.Sprintf("%.1f", r.CPUReadyPct), fmt.Sprintf("%.1f", r.CPUThrottledPct)
		}
		ent, rate, pct := "-", "-", "-"
		if r.Port != "-" {
			ent, rate = fmt.Sprintf("%.1f", r.EntitledBps/1e6), fmt.Sprintf("%.1f", r.RateBps/1e6)
			if r.EntitledBps > 0 {
				pct = fmt.Sprintf("%.0f", r.RatePct())
			}
		}
		dn, iops, ient := "-", "-", "-"
		if r.Disks > 0 {
			dn, iops, ient = fmt.Sprint(r.Disks), fmt.Sprintf("%.0f", r.IOPS), fmt.Sprintf("%.0f", r.IOPSEntitled)
		}
		line("%s%-13s %-18s %-7s %10s %10s %6s %6d %7s %7s %7s %6s %8s %8s", mark, r.VM, r.Port, r.Uplink, ent, rate, pct, r.Backlog, cpu, rdy, thr, dn, iops, ient)
	}
	line("")
	if sel >= 0 && sel < len(rows) {
		if s.Controller != "" {
			r := rows[sel]
			line("%s on %s: entitled %s by its host's desired state, measured %s, reported %s",
				r.Port, r.Uplink, mbps(r.EntitledBps), mbps(r.RateBps), r.At.Format("15:04:05"))
			line("why: sluice ctl explain %s", r.Port)
		} else {
			for _, l := range reasons(rows[sel]) {
				line("%s", l)
			}
		}
	}
	line("keys: ↑/↓ select  n e r p c y t i sort by name, entitled, rate, %%ent, cpu, ready, throttled, iops  q quit")
	return b.String()
}

// reasons are the lines that say why the selected row gets what it gets.
func reasons(r Row) []string {
	var out []string
	if r.Port != "-" {
		lim := "unlimited"
		if r.LimitBps > 0 {
			lim = mbps(r.LimitBps)
		}
		out = append(out, fmt.Sprintf("%s on %s: entitled %s (reservation %s, shares %g, limit %s), measured %s; queue %d packets, %d drops",
			r.Port, r.Uplink, mbps(r.EntitledBps), mbps(r.ReservationBps), r.Shares, lim, mbps(r.RateBps), r.Backlog, r.Drops))
	}
	if r.HasCPU {
		out = append(out, fmt.Sprintf("%s CPU: entitled %.0f MHz (%s), used %.1f%%, ready %.1f%%, throttled %.1f%%", r.VM, r.CPUEntitledMHz, r.CPUReason, r.CPUUsedPct, r.CPUReadyPct, r.CPUThrottledPct))
	}
	if r.Disks > 0 {
		out = append(out, fmt.Sprintf("%s disks: %d, %.0f IOPS of %.0f entitled, busiest %.2f ms mean latency", r.VM, r.Disks, r.IOPS, r.IOPSEntitled, r.DiskLatencyMs))
	}
	return out
}

func mbps(bps float64) string {
	if bps >= 1e9 {
		return fmt.Sprintf("%.2f Gbps", bps/1e9)
	}
	return fmt.Sprintf("%.1f Mbps", bps/1e6)
}
