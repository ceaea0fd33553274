package virt

import (
	"errors"
	"fmt"
	"sync"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/agent"
)

// Pinner pins the threads of running domains through libvirt, on the live
// domain only (VIR_DOMAIN_AFFECT_LIVE: a domain's definition is never
// changed, so its next start has its own pinning again): vCPUs with
// virDomainPinVcpuFlags, the emulator threads with virDomainPinEmulator,
// read back with virDomainGetVcpuPinInfo and virDomainGetEmulatorPinInfo.
// libvirt sets the threads' affinity and, where the cpuset controller is
// mounted, the cpuset of their cgroups.
type Pinner struct {
	l *libvirt.Libvirt

	mu   sync.Mutex
	cpus int // the host's CPUs (NodeGetInfo), read once
}

var _ agent.Pinner = (*Pinner)(nil)

// Pinner returns the connection's Pinner.
func (c *Libvirt) Pinner() *Pinner { return &Pinner{l: c.l} }

// hostCPUs is the number of the host's CPUs, which sizes the CPU maps.
func (p *Pinner) hostCPUs() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cpus > 0 {
		return p.cpus, nil
	}
	_, _, cpus, _, _, _, _, _, err := p.l.NodeGetInfo()
	if err != nil {
		return 0, fmt.Errorf("NodeGetInfo: %w", err)
	}
	p.cpus = int(cpus)
	return p.cpus, nil
}

// Pins reads the running domain's live pinning.
func (p *Pinner) Pins(name string) (agent.DomainPins, error) {
	var out agent.DomainPins
	cpus, err := p.hostCPUs()
	if err != nil {
		return out, err
	}
	d, err := runningDomain(p.l, name)
	if err != nil {
		return out, err
	}
	out.ID = int(d.ID)
	_, _, _, nvcpu, _, err := p.l.DomainGetInfo(d)
	if err != nil {
		return out, fmt.Errorf("DomainGetInfo %s: %w", name, notRunning(err))
	}
	maplen := mapLen(cpus)
	maps, n, err := p.l.DomainGetVcpuPinInfo(d, int32(nvcpu), int32(maplen), uint32(libvirt.DomainAffectLive))
	if err != nil {
		return out, fmt.Errorf("DomainGetVcpuPinInfo %s: %w", name, notRunning(err))
	}
	for i := 0; i < int(n) && (i+1)*maplen <= len(maps); i++ {
		out.VCPUs = append(out.VCPUs, parseCPUMap(maps[i*maplen:(i+1)*maplen], cpus))
	}
	em, ret, err := p.l.DomainGetEmulatorPinInfo(d, int32(maplen), libvirt.DomainAffectLive)
	if err != nil {
		return out, fmt.Errorf("DomainGetEmulatorPinInfo %s: %w", name, notRunning(err))
	}
	if ret > 0 {
		out.Emulator = parseCPUMap(em, cpus)
	}
	return out, nil
}

// PinVCPU pins the running domain's vCPU vcpu to cpus (live).
func (p *Pinner) PinVCPU(name string, vcpu int, cpus []int) error {
	n, err := p.hostCPUs()
	if err != nil {
		return err
	}
	m, err := cpuMap(cpus, n)
	if err != nil {
		return fmt.Errorf("DomainPinVcpuFlags %s vCPU %d: %w", name, vcpu, err)
	}
	d, err := runningDomain(p.l, name)
	if err != nil {
		return err
	}
	if err := p.l.DomainPinVcpuFlags(d, uint32(vcpu), m, uint32(libvirt.DomainAffectLive)); err != nil {
		return fmt.Errorf("DomainPinVcpuFlags %s vCPU %d: %w", name, vcpu, notRunning(err))
	}
	return nil
}

// PinEmulator pins the running domain's emulator threads to cpus (live).
func (p *Pinner) PinEmulator(name string, cpus []int) error {
	n, err := p.hostCPUs()
	if err != nil {
		return err
	}
	m, err := cpuMap(cpus, n)
	if err != nil {
		return fmt.Errorf("DomainPinEmulator %s: %w", name, err)
	}
	d, err := runningDomain(p.l, name)
	if err != nil {
		return err
	}
	if err := p.l.DomainPinEmulator(d, m, libvirt.DomainAffectLive); err != nil {
		return fmt.Errorf("DomainPinEmulator %s: %w", name, notRunning(err))
	}
	return nil
}

// mapLen is the length in bytes of a CPU map of n CPUs.
func mapLen(n int) int { return (n + 7) / 8 }

// parseCPUMap lists the CPUs (below n) whose bits are set in libvirt's CPU
// map m (CPU i is bit i%8 of byte i/8).
func parseCPUMap(m []byte, n int) []int {
	var out []int
	for i := 0; i < n && i/8 < len(m); i++ {
		if m[i/8]&(1<<(i%8)) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// cpuMap is libvirt's CPU map of cpus on a host of n CPUs.
func cpuMap(cpus []int, n int) ([]byte, error) {
	if len(cpus) == 0 {
		return nil, errors.New("no CPU to pin to")
	}
	m := make([]byte, mapLen(n))
	for _, c := range cpus {
		if c < 0 || c >= n {
			return nil, fmt.Errorf("CPU %d: the host has CPUs 0-%d (are the policy's cpu.cores this host's CPUs?)", c, n-1)
		}
		m[c/8] |= 1 << (c % 8)
	}
	return m, nil
}

// DomainName names the running domain of policy VM vm (found by name or
// UUID), for the agent's pinning (agent.DomainInventory).
func (inv *Inventory) DomainName(vm string) (string, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	d := inv.lookupLocked(vm)
	if d == nil {
		return "", false
	}
	return d.Name, true
}
