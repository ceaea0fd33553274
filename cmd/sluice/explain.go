package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"sluice/alloc"
	"sluice/cpuctl"
	"sluice/entitle"
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

// CPU cost of sending, from the simulator's seed-003 model
// (sim.DefaultCPUParams, fitted once to seed 003's sweep: 1 vCPU, iperf3,
// 2600 MHz → 19.2 Gbps and 400 MHz → 2.2 Gbps): CyclesPerByte cycles per
// payload byte are CyclesPerByte × 125 MHz per Gbps (129.4), above an
// overhead of OverheadMHz (115) that the guest spends on anything else.
// Until the agent measures the cost on the host (issue 17), explain uses
// these; --cpu-mhz-per-gbps replaces the first.
var (
	defaultCPUMHzPerGbps = sim.DefaultCPUParams.CyclesPerByte * 1e9 / 8 / 1e6
	cpuOverheadMHz       = sim.DefaultCPUParams.OverheadMHz
)

func runExplain(args []string, stdout, stderr io.Writer) int {
	args, cost, err := cutCPUCostFlag(args)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v; %s\n", err, explainUsage)
		return exitUsage
	}
	a, code, ok := parseOrExit(args, explainUsage, stdout, stderr)
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
	if err != nil {
		if dl, ok := explainDisk(p, port); ok {
			lines, err = dl, nil
		}
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

// cpuCost is the CPU cost of sending and where it came from.
type cpuCost struct {
	mhzPerGbps float64
	source     string
}

// cutCPUCostFlag takes --cpu-mhz-per-gbps MHZ (or =MHZ) out of args.
func cutCPUCostFlag(args []string) ([]string, cpuCost, error) {
	c := cpuCost{defaultCPUMHzPerGbps, "seed 003's model"}
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
		c = cpuCost{v, "--cpu-mhz-per-gbps"}
	}
	return rest, c, nil
}

// explainCPU links the CPU and the network of the VM of a vNIC port: the
// VM's CPU entitlement on its host under full contention (cpuctl.Derive
// with every VM placed there busy) against what sending its vNICs'
// network entitlements costs (cpuOverheadMHz + the cost per Gbps). ok is
// false for a port that is no placed VM's vNIC, or a host or VM without
// CPU figures.
func explainCPU(p *policy.Policy, n *entitle.Net, port string, cost cpuCost) (string, bool) {
	vmName, _, _ := strings.Cut(port, "/")
	vm := p.VM(vmName)
	if vm == nil || vm.Host == "" || len(n.Port(port)) == 0 || n.Port(port)[0].Kind != entitle.KindVNIC {
		return "", false
	}
	h := p.Host(vm.Host)
	if h == nil || h.CPU.Cores <= 0 || h.CPU.MHz <= 0 {
		return "", false
	}
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
	driveBps := math.Max(s.EntitlementMHz-cpuOverheadMHz, 0) / cost.mhzPerGbps * 1e9
	reason := s.Reason.String()
	if s.Reason == alloc.LimitBound && (vm.CPU.LimitMHz == 0 || s.EntitlementMHz < float64(vm.CPU.LimitMHz)) {
		reason = fmt.Sprintf("vCPUs: %d × %d MHz", vm.CPU.VCPUs, h.CPU.MHz)
	}
	what := "its vNIC's"
	if len(nics) > 1 {
		what = "its vNICs' (" + strings.Join(nics, " ") + ")"
	}
	head := fmt.Sprintf("cpu: %s is entitled to %.0f MHz (%s) of host %s's %d × %d MHz with every VM there busy; at %.1f MHz per Gbps above %.0f MHz (%s) that drives %s",
		vm.Name, s.EntitlementMHz, reason, h.Name, h.CPU.Cores, h.CPU.MHz, cost.mhzPerGbps, cpuOverheadMHz, cost.source, entitle.FormatBps(driveBps))
	if netBps <= driveBps {
		return fmt.Sprintf("%s, enough for %s network entitlement %s", head, what, entitle.FormatBps(netBps)), true
	}
	needMHz := cpuOverheadMHz + netBps/1e9*cost.mhzPerGbps
	return fmt.Sprintf("%s: the CPU is the bottleneck, %s (%.0f%%) short of %s network entitlement %s, which needs %.0f MHz",
		head, entitle.FormatBps(netBps-driveBps), 100*(netBps-driveBps)/netBps, what, entitle.FormatBps(netBps), needMHz), true
}

// explainDisk explains a disk VM/DISK on its datastore at the array's
// nominal rate, with every disk's demand unbounded.
func explainDisk(p *policy.Policy, name string) ([]string, bool) {
	for _, ds := range p.Datastores {
		s, err := entitle.Storage(p, ds.Name, 0, nil)
		if err != nil || s.Disk(name) == nil {
			continue
		}
		lines, err := s.Explain(name)
		return lines, err == nil
	}
	return nil, false
}
