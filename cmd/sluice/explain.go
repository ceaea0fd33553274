package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"sluice/agent"
	"sluice/alloc"
	"sluice/cpuctl"
	"sluice/entitle"
	"sluice/lab"
	"sluice/policy"
	"sluice/sim"
)

func init() {
	register(command{
		name:    "explain",
		summary: "why a port (VM/NIC, HOST/CLASS) or disk (VM/DISK) gets what it gets, level by level",
		run:     runExplain,
	})
}

const explainUsage = "usage: sluice explain FILE PORT [--demand PORT=RATE ...] [--unnamed HOST/VM/NIC ...] [--cpu-mhz-per-gbps MHZ]"

// CPU cost of sending when the host has no measured one (its policy's
// cpu.sendMHzPerGbps): the simulator's seed-003 model
// (sim.DefaultCPUParams, fitted once to seed 003's whole sweep: 1 vCPU,
// iperf3): CyclesPerByte cycles per payload byte (CyclesPerByte × 125 MHz
// per Gbps) plus the ACKs, CyclesPerAck per AckBytes of payload up to
// MaxAckRate passes per second (sim.CPUParams.SendMHz, SendBps).
// --cpu-mhz-per-gbps replaces the cost per Gbps of either (a linear cost
// then, with no ACK term).
var seed003CPU = sim.DefaultCPUParams

func runExplain(args []string, stdout, stderr io.Writer) int {
	args, cost, err := cutCPUCostFlag(args)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v; %s\n", err, explainUsage)
		return exitUsage
	}
	a, code, ok := parseOrExit("explain", args, explainUsage, stdout, stderr)
	if !ok {
		return code
	}
	if len(a.rest) != 1 {
		fmt.Fprintf(stderr, "sluice: explain wants one PORT; %s\n", explainUsage)
		return exitUsage
	}
	port := a.rest[0]
	p, code := loadPolicy(a.file, stderr)
	if p == nil {
		return code
	}
	n, err := entitle.NetworkWith(p, a.unnamed, a.demands)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	lines, err := n.Explain(port)
	if err == nil {
		lines = withInbound(p, a.unnamed, port, lines)
	} else if dl, ok := explainDisk(p, port); ok {
		lines, err = dl, nil
	}
	if err != nil {
		hint := ""
		if vm, _, ok := strings.Cut(port, "/"); ok && p.VM(vm) == nil && p.Host(vm) == nil {
			hint = fmt.Sprintf("; %s is no VM of the policy: for one that runs unnamed give --unnamed HOST/%s", vm, port)
		}
		fmt.Fprintf(stderr, "sluice: %s: no such port or disk (ports are VM/NIC of a placed VM or HOST/CLASS; disks VM/DISK)%s\n", port, hint)
		return exitBad
	}
	if l, ok := explainCPU(p, n, port, cost); ok {
		lines = append(lines, l)
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return exitOK
}

// cpuCost is the CPU cost of sending and where it came from: linear
// (mhzPerGbps above overheadMHz) or, with model set, the simulator's
// CPU model.
type cpuCost struct {
	mhzPerGbps  float64
	overheadMHz float64
	source      string
	flag        bool           // --cpu-mhz-per-gbps: replaces the host's cost per Gbps
	model       *sim.CPUParams // the seed-003 model (no measured cost, no flag)
}

// segBytes is the segment size the simulator's CPU model charges per
// packet at.
var segBytes = float64(sim.DefaultNetParams.SegmentBytes)

// driveBps is the payload rate that mhz of CPU can send.
func (c cpuCost) driveBps(mhz float64) float64 {
	if c.model != nil {
		return c.model.SendBps(mhz, segBytes)
	}
	return math.Max(mhz-c.overheadMHz, 0) / c.mhzPerGbps * 1e9
}

// needMHz is what sending bps costs.
func (c cpuCost) needMHz(bps float64) float64 {
	if c.model != nil {
		return c.model.SendMHz(bps, segBytes)
	}
	return c.overheadMHz + bps/1e9*c.mhzPerGbps
}

// String says how the cost is computed.
func (c cpuCost) String() string {
	if m := c.model; m != nil {
		return fmt.Sprintf("%.1f MHz per Gbps, plus %.1f MHz per Gbps of ACKs up to %.0f MHz (%s)",
			m.CyclesPerByte*125, m.CyclesPerAck/m.AckBytes*125, m.CyclesPerAck*m.MaxAckRate/1e6, c.source)
	}
	return fmt.Sprintf("%.1f MHz per Gbps above %.0f MHz (%s)", c.mhzPerGbps, c.overheadMHz, c.source)
}

// hostCost is the cost of sending on host h: its measured cost when the
// policy gives one, else the seed-003 model; the flag's cost per Gbps
// replaces either.
func hostCost(h *policy.Host, flag cpuCost) cpuCost {
	c := cpuCost{seed003CPU.CyclesPerByte * 125, seed003CPU.OverheadMHz, "seed 003's model", false, &seed003CPU}
	if h.CPU.SendMHzPerGbps > 0 {
		c = cpuCost{float64(h.CPU.SendMHzPerGbps), float64(h.CPU.SendOverheadMHz), "measured on " + h.Name + ", cpu.sendMHzPerGbps", false, nil}
	}
	if flag.flag {
		c.mhzPerGbps, c.source, c.model = flag.mhzPerGbps, flag.source, nil
	}
	return c
}

// cutCPUCostFlag takes --cpu-mhz-per-gbps MHZ (or =MHZ) out of args.
func cutCPUCostFlag(args []string) ([]string, cpuCost, error) {
	var c cpuCost
	var rest []string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		if name != "--cpu-mhz-per-gbps" && name != "-cpu-mhz-per-gbps" {
			rest = append(rest, args[i])
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, c, fmt.Errorf("flag %s needs a value", name)
			}
			i++
			val = args[i]
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, c, fmt.Errorf("%s %s: want MHz per Gbps, a number above 0", name, val)
		}
		c = cpuCost{mhzPerGbps: v, source: "--cpu-mhz-per-gbps", flag: true}
	}
	return rest, c, nil
}

// explainCPU links the CPU and the network of the VM of a vNIC port: the
// VM's CPU entitlement on its host under full contention (cpuctl.Derive
// with every VM placed there busy) against what sending its vNICs'
// network entitlements costs (hostCost: an overhead + the cost per Gbps). ok is
// false for a port that is no placed VM's vNIC, or a host or VM without
// CPU figures.
func explainCPU(p *policy.Policy, n *entitle.Net, port string, flag cpuCost) (string, bool) {
	vmName, _, _ := strings.Cut(port, "/")
	vm := p.VM(vmName)
	if vm == nil || vm.Host == "" || len(n.Port(port)) == 0 || n.Port(port)[0].Kind != entitle.KindVNIC {
		return "", false
	}
	h := p.Host(vm.Host)
	if h == nil || h.CPU.Cores <= 0 || h.CPU.MHz <= 0 {
		return "", false
	}
	cost := hostCost(h, flag)
	var vms []cpuctl.VM
	idx := -1
	for i := range p.VMs {
		if p.VMs[i].Host != vm.Host {
			continue
		}
		if p.VMs[i].Name == vm.Name {
			idx = len(vms)
		}
		vms = append(vms, cpuctl.FromPolicy(&p.VMs[i]))
	}
	s := cpuctl.Derive(cpuctl.HostCPU{Cores: h.CPU.Cores, MHz: h.CPU.MHz}, vms)[idx]
	// The VM's CPU drives all its vNICs.
	netBps := 0.0
	var nics []string
	for _, nic := range vm.NICs {
		name := policy.PortName(vm.Name, nic.Name)
		for _, pt := range n.Port(name) {
			netBps += pt.AllocBps()
			nics = append(nics, name)
		}
	}
	driveBps := cost.driveBps(s.EntitlementMHz)
	reason := s.Reason.String()
	if s.Reason == alloc.LimitBound && (vm.CPU.LimitMHz == 0 || s.EntitlementMHz < float64(vm.CPU.LimitMHz)) {
		reason = fmt.Sprintf("vCPUs: %d × %d MHz", vm.CPU.VCPUs, h.CPU.MHz)
	}
	what := "its vNIC's"
	if len(nics) > 1 {
		what = "its vNICs' (" + strings.Join(nics, " ") + ")"
	}
	head := fmt.Sprintf("cpu: %s is entitled to %.0f MHz (%s) of host %s's %d × %d MHz with every VM there busy; at %s that drives %s",
		vm.Name, s.EntitlementMHz, reason, h.Name, h.CPU.Cores, h.CPU.MHz, cost, entitle.FormatBps(driveBps))
	if netBps <= driveBps {
		return fmt.Sprintf("%s, enough for %s network entitlement %s", head, what, entitle.FormatBps(netBps)), true
	}
	needMHz := cost.needMHz(netBps)
	return fmt.Sprintf("%s: the CPU is the bottleneck, %s (%.0f%%) short of %s network entitlement %s, which needs %.0f MHz",
		head, entitle.FormatBps(netBps-driveBps), 100*(netBps-driveBps)/netBps, what, entitle.FormatBps(netBps), needMHz), true
}

// explainDisk explains a disk VM/DISK on its datastore at the array's
// nominal rate, with every disk's demand unbounded; then its datastore's
// driver and, when the throttle driver of the disk's host runs here (its
// status file in the state directory), what it measured and set.
func explainDisk(p *policy.Policy, name string) ([]string, bool) {
	for _, ds := range p.Datastores {
		s, err := entitle.Storage(p, ds.Name, 0, nil)
		if err != nil || s.Disk(name) == nil {
			continue
		}
		lines, err := s.Explain(name)
		if err != nil {
			return lines, false
		}
		lines = append(lines, driverLine(&ds))
		return append(lines, throttleLines(p, s.Disk(name).Host, name, lab.DefaultStateDir)...), true
	}
	return nil, false
}

// driverLine says which driver controls a datastore's disks.
func driverLine(ds *policy.Datastore) string {
	if ds.Driver != "" {
		return fmt.Sprintf("driver: %s (datastore %s says so)", ds.Driver, ds.Name)
	}
	return fmt.Sprintf("driver: %s where `sluice datastore create` made datastore %s (its stats volume is there), else %s",
		ds.DriverAt(true), ds.Name, ds.DriverAt(false))
}

// throttleLines explains what the throttle driver of host did to disk
// name in its last period, from its status file in stateDir; nothing when
// the file is not there.
func throttleLines(p *policy.Policy, host, name, stateDir string) []string {
	path := agent.ThrottleStatusPath(stateDir, p.Cluster, host)
	st, err := agent.ReadThrottleStatus(path)
	if err != nil {
		return nil
	}
	ago := time.Since(time.Unix(0, st.TimeUnixNs)).Round(100 * time.Millisecond)
	for _, d := range st.Disks {
		if d.Disk != name {
			continue
		}
		out := []string{fmt.Sprintf("live, throttle driver of host %s (%s ago, period %.1fs; %s):", host, ago, st.PeriodS, path)}
		for _, ds := range st.Datastores {
			if ds.Name != d.Datastore {
				continue
			}
			if !ds.SIOC {
				out = append(out, fmt.Sprintf("  datastore %s: no SIOC, no host budget: only limits are set", ds.Name))
				break
			}
			out = append(out, fmt.Sprintf("  host budget %.0f IOPS = window %.2f / threshold %.0f ms; datastore latency %.2f ms over %d hosts, this host's %.2f ms (%d probes)",
				ds.BudgetIOPS, ds.Window, ds.ThresholdMs, ds.DatastoreLatencyMs, ds.HostsSeen, ds.HostLatencyMs, ds.Probes))
			if ds.Error != "" {
				out = append(out, "  error: "+ds.Error)
			}
		}
		dem, held := "unbounded", ""
		if d.DemandIOPS >= 0 {
			dem = fmt.Sprintf("%.0f IOPS", d.DemandIOPS)
		}
		if d.Bound {
			held = ", held by its throttle (it wants more)"
		}
		out = append(out, fmt.Sprintf("  %s (%s %s) did %.0f IOPS, %.2f MB/s at %.2f ms%s; demand %s",
			name, d.VM, d.Target, d.IOPS, d.MBps, d.LatencyMs, held, dem))
		thr := "none (QEMU unthrottled)"
		if d.ThrottleIOPS > 0 {
			thr = fmt.Sprintf("%d IOPS (of 32 KiB units)", d.ThrottleIOPS)
		}
		ent := "unbounded"
		if d.EntitlementIOPS >= 0 {
			ent = fmt.Sprintf("%.0f IOPS", d.EntitlementIOPS)
		}
		out = append(out, fmt.Sprintf("  entitled to %s of the budget; QEMU throttle %s: %s", ent, thr, d.Why))
		return out
	}
	return nil
}

// withInbound adds to the explanation of port (outbound) that of what it
// receives, when it has an ingress setting: the two parts are headed
// "outbound:" and "inbound:". Without one the explanation is as before,
// with a line saying its inbound traffic is not controlled when some
// other port of the policy has one.
func withInbound(p *policy.Policy, unnamed []entitle.UnnamedVM, port string, out []string) []string {
	in, err := entitle.Inbound(p, unnamed, nil)
	if err != nil {
		return out
	}
	inLines, err := in.Explain(port)
	if err != nil {
		if len(inboundPorts(in)) > 0 {
			out = append(out, port+" has no ingress setting: what it receives is not controlled")
		}
		return out
	}
	lines := append([]string{"outbound (what " + port + " sends):"}, out...)
	lines = append(lines, "inbound (what "+port+" receives):")
	return append(lines, inLines...)
}
