package cpuctl

import (
	"fmt"
	"strconv"
	"strings"
)

// Pinning is where the VMs of a host may run when some of them are
// latency-sensitive (issue 27, seed 004): each vCPU of such a VM gets a
// core of its own, every other VM (and the emulator threads of all of
// them) the cores nobody pinned. Cores are Linux CPU numbers: the
// policy's cores of a host are its CPUs 0..Cores-1, of which the first
// HostCores are kept for the host itself.
type Pinning struct {
	// HostCores are the cores kept for the host (never pinned to a VM).
	HostCores []int
	// Shared are the cores the VMs that are not pinned may run on: the
	// host's cores less those pinned to latency-sensitive VMs (the host's
	// own cores included). Nil when nothing is pinned: every VM keeps
	// the affinity it has.
	Shared []int
	// VMs maps each pinned VM to its cores: vCPU i runs on VMs[vm][i].
	VMs map[string][]int
	// Order lists the pinned VMs in the order given.
	Order []string
	// Unpinned are the latency-sensitive VMs that found no cores left
	// (admission keeps this from happening; a domain started behind
	// sluice's back can): they run on the shared cores like the others.
	Unpinned []string
}

// Pinned reports whether some VM is pinned.
func (p Pinning) Pinned() bool { return len(p.Order) > 0 }

// Pin decides the pinning of the VMs of host h (in the order given, the
// policy's): a latency-sensitive VM takes the next VCPUs free cores
// above the host's own (HostCores), one per vCPU; one that does not fit
// in what is left is not pinned, and a later, smaller one may still be.
// A host whose cores are not modelled (Cores 0) pins nothing. Pure.
func Pin(h HostCPU, vms []VM) Pinning {
	p := Pinning{VMs: map[string][]int{}}
	if h.Cores <= 0 {
		for _, v := range vms {
			if v.Sensitive {
				p.Unpinned = append(p.Unpinned, v.Name)
			}
		}
		return p
	}
	own := min(max(h.HostCores, 0), h.Cores)
	for c := 0; c < own; c++ {
		p.HostCores = append(p.HostCores, c)
	}
	next := own
	for _, v := range vms {
		if !v.Sensitive {
			continue
		}
		n := max(v.VCPUs, 1)
		if next+n > h.Cores {
			p.Unpinned = append(p.Unpinned, v.Name)
			continue
		}
		cores := make([]int, n)
		for i := range cores {
			cores[i] = next + i
		}
		next += n
		p.VMs[v.Name] = cores
		p.Order = append(p.Order, v.Name)
	}
	if !p.Pinned() {
		return p
	}
	for c := 0; c < h.Cores; c++ {
		if c < own || c >= next {
			p.Shared = append(p.Shared, c)
		}
	}
	return p
}

// PinnedCount is the number of cores pinned to VMs.
func (p Pinning) PinnedCount() int {
	n := 0
	for _, cs := range p.VMs {
		n += len(cs)
	}
	return n
}

// FormatCPUs renders a CPU list as the kernel and virsh do: "0,2-5".
func FormatCPUs(cpus []int) string {
	if len(cpus) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
