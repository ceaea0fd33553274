package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"

	"sluice/cpuctl"
	"sluice/policy"
)

// CgroupInventory is an Inventory that knows the CPU cgroup of each
// running VM, relative to the root of the cgroup hierarchy (the lab's
// "sl-<cluster>-<vm>", libvirt's machine scope). The agent sets the CPU
// entitlements of the VMs it finds a group for (Config.Cgroups).
type CgroupInventory interface {
	VMCgroup(vm string) (group string, ok bool)
}

// defaultSetting is the kernel's setting of a new group: what a VM's group
// gets back when the VM stops or leaves the policy.
var defaultSetting = cpuctl.Setting{Weight: 100, Shares: 1024, QuotaUs: -1, PeriodUs: cpuctl.DefaultPeriodUs}

// cpuVM is a running VM whose CPU the agent controls, and its history.
type cpuVM struct {
	vm     *policy.VM
	group  string // "" when the inventory knows none: counted, not set
	prev   cpuctl.Stats
	prevNs int64
	have   bool
	rates  cpuctl.Rates
	demand demand // MHz used in the intervals of the last DemandWindowNs
	entMHz float64
}

// CPUReading is one VM's cgroup counters as Measure read them.
type CPUReading struct {
	VM, Group string
	Stats     cpuctl.Stats
	Err       error
}

// CPUAction is the desired CPU state of one cgroup: a running VM's
// derived setting, or (Reset) the kernel's defaults for the group of a VM
// that stopped or left the policy.
type CPUAction struct {
	VM, Group string
	Setting   cpuctl.Setting
	Reset     bool
}

// CPUStat is one VM's CPU as the agent set and measured it. Percentages
// are of one core over the last interval (200 is two cores busy).
type CPUStat struct {
	VM     string `json:"vm"`
	Cgroup string `json:"cgroup"`
	// The VM's setting in force here (the policy's, with every change):
	// vCPUs, memory (admission; the hypervisor sizes the VM), and CPU
	// reservation, shares and limit (MHz; 0: none or unlimited), from
	// which the cgroup's shares, weight and quota below derive.
	VCPUs          int     `json:"vcpus"`
	MemoryBytes    int64   `json:"memory_bytes,omitempty"`
	ReservationMHz int     `json:"reservation_mhz"`
	SharesSetting  int     `json:"shares_setting"`
	LimitMHz       int     `json:"limit_mhz,omitempty"`
	EntitlementMHz float64 `json:"entitlement_mhz"`
	Reason         string  `json:"reason"`
	DemandMHz      float64 `json:"demand_mhz"` // -1: unbounded
	Weight         int     `json:"weight"`     // cpu.weight (v2)
	Shares         int     `json:"shares"`     // cpu.shares (v1)
	CPUMax         string  `json:"cpu_max"`    // "QUOTA PERIOD" or "max PERIOD"
	// Cores are the cores of its own a latency-sensitive VM's vCPUs are
	// pinned to ("1", "2-5"); "" for a VM not pinned.
	Cores        string  `json:"cores,omitempty"`
	UsedPct      float64 `json:"used_pct"`
	ThrottledPct float64 `json:"throttled_pct"` // throttled time per wall time
	// ReadyPct is the ready-time analog: run-queue wait per wall time,
	// summed over the VM's threads (esxtop's %RDY).
	ReadyPct    float64 `json:"ready_pct"`
	PressurePct float64 `json:"pressure_pct,omitempty"` // PSI "some", where the kernel has it
	Err         string  `json:"error,omitempty"`
}

// deriveCPU lists the VMs of the policy that the inventory says run on
// the host, with their cgroup, keeping the history of those already
// known.
func deriveCPU(p *policy.Policy, host string, inv Inventory, old map[string]*cpuVM) ([]*cpuVM, error) {
	names, err := inv.VMs()
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	running := map[string]bool{}
	for _, n := range names {
		running[n] = true
	}
	ci, _ := inv.(CgroupInventory)
	var out []*cpuVM
	for i := range p.VMs {
		vm := &p.VMs[i]
		// The inventory is the truth about what runs here, wherever the
		// policy (or the controller) placed the VM.
		if !running[vm.Name] {
			continue
		}
		g := ""
		if ci != nil {
			g, _ = ci.VMCgroup(vm.Name)
		}
		c := old[vm.Name]
		if c == nil || c.group != g {
			c = &cpuVM{group: g}
		}
		c.vm = vm
		out = append(out, c)
	}
	return out, nil
}

// setCPU installs the CPU VMs of a new derivation: the groups of VMs that
// are gone get the kernel's defaults back at the next Apply.
func (a *Agent) setCPU(vms []*cpuVM) {
	keep := map[string]bool{}
	for _, c := range vms {
		keep[c.group] = true
	}
	for _, c := range a.cpuVMs {
		if c.group != "" && !keep[c.group] {
			a.cpuGone[c.group] = c.vm.Name
		}
	}
	for _, c := range vms {
		delete(a.cpuGone, c.group)
	}
	a.cpuVMs = vms
}

func (a *Agent) cpuByName() map[string]*cpuVM {
	m := map[string]*cpuVM{}
	for _, c := range a.cpuVMs {
		m[c.vm.Name] = c
	}
	return m
}

// measureCPU reads the counters of every controlled VM's cgroup.
func (a *Agent) measureCPU() []CPUReading {
	if a.cfg.Cgroups == nil {
		return nil
	}
	var out []CPUReading
	for _, c := range a.cpuVMs {
		r := CPUReading{VM: c.vm.Name, Group: c.group}
		if c.group == "" {
			r.Err = fmt.Errorf("cpu %s: the inventory knows no cgroup for it", c.vm.Name)
		} else if st, err := a.cfg.Cgroups.Stats(c.group); err != nil {
			r.Err = fmt.Errorf("cpu %s: stats %s: %w", c.vm.Name, c.group, err)
		} else {
			r.Stats = st
		}
		out = append(out, r)
	}
	return out
}

// decideCPU computes the VMs' rates from the readings, their demand (in
// dynamic mode) and their settings (cpuctl.Derive over the host's cores ×
// MHz), and the statistics. It does no I/O.
func (a *Agent) decideCPU(m Measurement, d *Decision) {
	if a.cfg.Cgroups == nil {
		return
	}
	h := a.cfg.Policy.Host(a.cfg.Host)
	hc := cpuctl.HostFromPolicy(h)
	if hc.Cores <= 0 || hc.MHz <= 0 {
		d.CPUErr = fmt.Errorf("cpu: host %s has no cpu (cores, mhz) in the policy; CPU control is off", a.cfg.Host)
		return
	}
	readings := map[string]CPUReading{}
	for _, r := range m.CPU {
		readings[r.VM] = r
	}
	vms := make([]cpuctl.VM, len(a.cpuVMs))
	for i, c := range a.cpuVMs {
		r, ok := readings[c.vm.Name]
		if ok && r.Err == nil {
			if c.have && m.NowNs > c.prevNs {
				c.rates = r.Stats.Rates(c.prev, m.NowNs-c.prevNs)
				used := c.rates.UsedCores * float64(hc.MHz)
				c.demand.add(m.NowNs, used, c.rates.NrThrottled > 0 || (c.entMHz > 0 && used >= SaturatedFraction*c.entMHz))
			}
			c.prev, c.prevNs, c.have = r.Stats, m.NowNs, true
		}
		vms[i] = cpuctl.FromPolicy(c.vm)
		if a.cfg.Dynamic {
			vms[i].DemandMHz = c.demand.estimate(m.NowNs, CPUHeadroomOfCore*float64(hc.MHz))
		}
	}
	set := cpuctl.Derive(hc, vms)
	d.Stats.CPUCapacityMHz = hc.CapacityMHz()
	if a.cfg.Pinner != nil {
		pin := cpuctl.Pin(hc, vms)
		d.Pins = decidePins(pin, a.cpuVMs, a.cfg.Inventory, d.Stats.Unnamed)
		for _, vm := range pin.Unpinned {
			d.CPUErrs = append(d.CPUErrs, fmt.Errorf("cpu %s: latency-sensitive, but no cores are left for it on host %s (%d cores, %d kept for the host): it runs on the shared cores", vm, a.cfg.Host, hc.Cores, hc.HostCores))
		}
	}
	for i, c := range a.cpuVMs {
		s := set[i]
		c.entMHz = s.EntitlementMHz
		if c.group != "" {
			d.CPU = append(d.CPU, CPUAction{VM: c.vm.Name, Group: c.group, Setting: s})
		}
		st := CPUStat{VM: c.vm.Name, Cgroup: c.group, VCPUs: c.vm.CPU.VCPUs, MemoryBytes: int64(c.vm.Memory),
			ReservationMHz: c.vm.CPU.ReservationMHz, SharesSetting: c.vm.CPU.Shares, LimitMHz: c.vm.CPU.LimitMHz,
			EntitlementMHz: math.Round(s.EntitlementMHz), Reason: s.ReasonString(), Cores: formatCores(s.Cores),
			DemandMHz: -1, Weight: s.Weight, Shares: s.Shares, CPUMax: s.CPUMax(),
			UsedPct: round1(100 * c.rates.UsedCores), ThrottledPct: round1(100 * c.rates.ThrottledFrac),
			ReadyPct: round1(c.rates.ReadyPct), PressurePct: round1(c.rates.PressurePct)}
		if !math.IsInf(vms[i].DemandMHz, 1) {
			st.DemandMHz = math.Round(vms[i].DemandMHz)
		}
		if r := readings[c.vm.Name]; r.Err != nil {
			st.Err = r.Err.Error()
			d.CPUErrs = append(d.CPUErrs, r.Err)
		}
		d.Stats.CPU = append(d.Stats.CPU, st)
	}
	gone := make([]string, 0, len(a.cpuGone))
	for g := range a.cpuGone {
		gone = append(gone, g)
	}
	sort.Strings(gone)
	for _, g := range gone {
		d.CPU = append(d.CPU, CPUAction{VM: a.cpuGone[g], Group: g, Setting: defaultSetting, Reset: true})
	}
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func formatCores(c []int) string {
	if c == nil {
		return ""
	}
	return cpuctl.FormatCPUs(c)
}

// applyCPU reconciles each cgroup with its action and returns the number
// of files written. A reset group that is gone (libvirt removes a stopped
// VM's scope) or was reset is forgotten.
func (a *Agent) applyCPU(d Decision) (int, error) {
	if a.cfg.Cgroups == nil {
		return 0, nil
	}
	errs := append([]error{d.CPUErr}, d.CPUErrs...)
	n := 0
	for _, act := range d.CPU {
		w, err := a.cfg.Cgroups.Apply(act.Group, act.Setting)
		n += len(w)
		if act.Reset {
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				delete(a.cpuGone, act.Group)
				continue
			}
			errs = append(errs, fmt.Errorf("cpu %s stopped: resetting %s: %w", act.VM, act.Group, err))
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cpu %s: apply %s: %w", act.VM, act.Group, err))
		}
	}
	return n, errors.Join(errs...)
}

// applyCPUAndPins reconciles the cgroups and then the pinning; it returns
// the files and the pinnings written.
func (a *Agent) applyCPUAndPins(d Decision) (files, pins int, err error) {
	files, err = a.applyCPU(d)
	if a.cfg.Cgroups == nil {
		return files, 0, err
	}
	pins, perr := a.applyPins(d)
	return files, pins, errors.Join(err, perr)
}
