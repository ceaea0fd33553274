package explain

import (
	"fmt"
	"math"
	"strings"

	"sluice/alloc"
	"sluice/cpuctl"
	"sluice/entitle"
	"sluice/policy"
	"sluice/sim"
)

// seed003 is the CPU cost of sending on a host without a measured one
// (its policy's cpu.sendMHzPerGbps): the simulator's seed-003 model
// (sim.DefaultCPUParams, fitted once to seed 003's whole sweep: 1 vCPU,
// iperf3): CyclesPerByte cycles per payload byte (CyclesPerByte × 125 MHz
// per Gbps) plus the ACKs, CyclesPerAck per AckBytes of payload up to
// MaxAckRate passes per second (sim.CPUParams.SendMHz, SendBps).
// Options.CPUMHzPerGbps replaces the cost per Gbps of either (a linear
// cost then, with no ACK term).
var seed003 = sim.DefaultCPUParams

// segBytes is the segment size the simulator's CPU model charges per
// packet at.
var segBytes = float64(sim.DefaultNetParams.SegmentBytes)

// cost is the CPU cost of sending and where it comes from: linear
// (mhzPerGbps above overheadMHz) or, with model set, the simulator's CPU
// model.
type cost struct {
	mhzPerGbps  float64
	overheadMHz float64
	source      string
	model       *sim.CPUParams
}

// hostCost is the cost of sending on host h: its measured cost when the
// policy gives one, else the seed-003 model; opt.CPUMHzPerGbps replaces
// the cost per Gbps of either.
func hostCost(h *policy.Host, opt Options) cost {
	c := cost{seed003.CyclesPerByte * 125, seed003.OverheadMHz, "seed 003's model", &seed003}
	if h.CPU.SendMHzPerGbps > 0 {
		c = cost{float64(h.CPU.SendMHzPerGbps), float64(h.CPU.SendOverheadMHz), "measured on " + h.Name + ", cpu.sendMHzPerGbps", nil}
	}
	if opt.CPUMHzPerGbps > 0 {
		c.mhzPerGbps, c.source, c.model = opt.CPUMHzPerGbps, opt.CPUCostSource, nil
		if c.source == "" {
			c.source = "given"
		}
	}
	return c
}

// driveBps is the payload rate (bits/s) that mhz of CPU can send.
func (c cost) driveBps(mhz float64) float64 {
	if c.model != nil {
		return c.model.SendBps(mhz, segBytes)
	}
	return math.Max(mhz-c.overheadMHz, 0) / c.mhzPerGbps * 1e9
}

// needMHz is what sending bps (bits/s) costs, in MHz.
func (c cost) needMHz(bps float64) float64 {
	if c.model != nil {
		return c.model.SendMHz(bps, segBytes)
	}
	return c.overheadMHz + bps/1e9*c.mhzPerGbps
}

// String says how the cost is computed.
func (c cost) String() string {
	if m := c.model; m != nil {
		return fmt.Sprintf("%.1f MHz per Gbps, plus %.1f MHz per Gbps of ACKs up to %.0f MHz (%s)",
			m.CyclesPerByte*125, m.CyclesPerAck/m.AckBytes*125, m.CyclesPerAck*m.MaxAckRate/1e6, c.source)
	}
	return fmt.Sprintf("%.1f MHz per Gbps above %.0f MHz (%s)", c.mhzPerGbps, c.overheadMHz, c.source)
}

// cpuLine links the CPU and the network of the VM of a vNIC port: the
// VM's CPU entitlement on the host it runs on in live under full
// contention (cpuctl.Derive with every VM of the policy that runs there
// busy) against what sending its vNICs' network entitlements in n costs
// (hostCost). ok is false for a port that is no vNIC of a VM of the
// policy, or a host or VM without CPU figures.
func cpuLine(p *policy.Policy, live entitle.Live, n *entitle.Net, port string, opt Options) (string, bool) {
	vmName, _, _ := strings.Cut(port, "/")
	vm := p.VM(vmName)
	pts := n.Port(port)
	if vm == nil || len(pts) == 0 || pts[0].Kind != entitle.KindVNIC {
		return "", false
	}
	host := live.HostOf(vm)
	h := p.Host(host)
	if h == nil || h.CPU.Cores <= 0 || h.CPU.MHz <= 0 {
		return "", false
	}
	c := hostCost(h, opt)
	var vms []cpuctl.VM
	idx := -1
	for i := range p.VMs {
		if live.HostOf(&p.VMs[i]) != host {
			continue
		}
		if p.VMs[i].Name == vm.Name {
			idx = len(vms)
		}
		vms = append(vms, cpuctl.FromPolicy(&p.VMs[i]))
	}
	s := cpuctl.Derive(cpuctl.HostFromPolicy(h), vms)[idx]
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
	driveBps := c.driveBps(s.EntitlementMHz)
	reason := s.ReasonString()
	if s.Reason == alloc.LimitBound && (vm.CPU.LimitMHz == 0 || s.EntitlementMHz < float64(vm.CPU.LimitMHz)) {
		reason = fmt.Sprintf("vCPUs: %d × %d MHz", vm.CPU.VCPUs, h.CPU.MHz)
	}
	what := "its vNIC's"
	if len(nics) > 1 {
		what = "its vNICs' (" + strings.Join(nics, " ") + ")"
	}
	head := fmt.Sprintf("cpu: %s is entitled to %.0f MHz (%s) of host %s's %d × %d MHz with every VM there busy; at %s that drives %s",
		vm.Name, s.EntitlementMHz, reason, h.Name, h.CPU.Cores, h.CPU.MHz, c, entitle.FormatBps(driveBps))
	if netBps <= driveBps {
		return fmt.Sprintf("%s, enough for %s network entitlement %s", head, what, entitle.FormatBps(netBps)), true
	}
	return fmt.Sprintf("%s: the CPU is the bottleneck, %s (%.0f%%) short of %s network entitlement %s, which needs %.0f MHz",
		head, entitle.FormatBps(netBps-driveBps), 100*(netBps-driveBps)/netBps, what, entitle.FormatBps(netBps), c.needMHz(netBps)), true
}

// PinLine says where vm's vCPUs run on the host it runs on in live when
// some VM there is latency-sensitive (cpuctl.Pin over the policy's VMs of
// that host, in file order, as the agent pins them): for a sensitive VM
// the cores of its own and why, for another VM the cores it is kept off
// and those it runs on. ok is false when nothing is pinned there and vm
// is not sensitive, or its host is unknown.
func PinLine(p *policy.Policy, live entitle.Live, vm *policy.VM) (string, bool) {
	h := p.Host(live.HostOf(vm))
	if h == nil {
		return "", false
	}
	var vms []cpuctl.VM
	for i := range p.VMs {
		if live.HostOf(&p.VMs[i]) == h.Name {
			vms = append(vms, cpuctl.FromPolicy(&p.VMs[i]))
		}
	}
	pin := cpuctl.Pin(cpuctl.HostFromPolicy(h), vms)
	kept := "no core is kept for the host (cpu.hostCores 0)"
	if len(pin.HostCores) > 0 {
		kept = fmt.Sprintf("%s kept for the host (cpu.hostCores %d)", coreList(pin.HostCores), len(pin.HostCores))
	}
	if cores := pin.VMs[vm.Name]; cores != nil {
		var each []string
		for i, c := range cores {
			each = append(each, fmt.Sprintf("vCPU %d on core %d", i, c))
		}
		return fmt.Sprintf("cpu pinning: %s is latency-sensitive: its vCPUs have %s of host %s to themselves (%s), entitled to them whole (%d MHz) with no CPU limit; %s; every other VM, and QEMU's emulator threads, run on %s",
			vm.Name, coreList(cores), h.Name, strings.Join(each, ", "), len(cores)*h.CPU.MHz, kept, coreList(pin.Shared)), true
	}
	if vm.LatencySensitive {
		if h.CPU.Cores <= 0 {
			return fmt.Sprintf("cpu pinning: %s is latency-sensitive, but host %s does not model its cores (no cpu.cores): its vCPUs are not pinned", vm.Name, h.Name), true
		}
		return fmt.Sprintf("cpu pinning: %s is latency-sensitive, but no cores are left for it on host %s (%d cores, %s, %d pinned): its vCPUs run on the shared cores (admission refuses this)",
			vm.Name, h.Name, h.CPU.Cores, kept, pin.PinnedCount()), true
	}
	if !pin.Pinned() {
		return "", false
	}
	var pinned []int
	var by []string
	for _, n := range pin.Order {
		pinned = append(pinned, pin.VMs[n]...)
		by = append(by, fmt.Sprintf("%s on %s", n, coreList(pin.VMs[n])))
	}
	return fmt.Sprintf("cpu pinning: %s is kept off %s of host %s, pinned to latency-sensitive VMs (%s): its vCPUs and QEMU's threads run on %s (%d MHz shared by the VMs not pinned)",
		vm.Name, coreList(pinned), h.Name, strings.Join(by, ", "), coreList(pin.Shared), len(pin.Shared)*h.CPU.MHz), true
}

// coreList renders cores: "core 1", "cores 0-1,7".
func coreList(cs []int) string {
	if len(cs) == 1 {
		return fmt.Sprintf("core %d", cs[0])
	}
	return "cores " + cpuctl.FormatCPUs(cs)
}
