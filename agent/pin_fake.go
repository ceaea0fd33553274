package agent

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// FakePinner is a stateful stand-in for the hypervisor's pinning, for
// tests: running domains with their vCPUs' and emulator's CPUs, which it
// renders as text, and the number of pinnings written.
type FakePinner struct {
	CPUs   int // the host's CPUs: a new domain may run on all of them
	Doms   map[string]*DomainPins
	Writes int
	// Fail makes every write to the named domain fail.
	Fail map[string]error
	ids  int
}

var _ Pinner = (*FakePinner)(nil)

// NewFakePinner returns a fake host of cpus CPUs with no domain running.
func NewFakePinner(cpus int) *FakePinner {
	return &FakePinner{CPUs: cpus, Doms: map[string]*DomainPins{}, Fail: map[string]error{}}
}

// Start runs domain dom with vcpus vCPUs, each free to run on every CPU
// (a domain whose definition pins nothing), under a new id.
func (f *FakePinner) Start(dom string, vcpus int) {
	all := make([]int, f.CPUs)
	for i := range all {
		all[i] = i
	}
	f.ids++
	p := &DomainPins{ID: f.ids, Emulator: all}
	for range vcpus {
		p.VCPUs = append(p.VCPUs, slices.Clone(all))
	}
	f.Doms[dom] = p
}

// Stop ends domain dom.
func (f *FakePinner) Stop(dom string) { delete(f.Doms, dom) }

// Pins returns dom's pinning.
func (f *FakePinner) Pins(dom string) (DomainPins, error) {
	p, ok := f.Doms[dom]
	if !ok {
		return DomainPins{}, fmt.Errorf("%s: %w", dom, ErrDomainNotRunning)
	}
	out := DomainPins{ID: p.ID, Emulator: slices.Clone(p.Emulator)}
	for _, c := range p.VCPUs {
		out.VCPUs = append(out.VCPUs, slices.Clone(c))
	}
	return out, nil
}

func (f *FakePinner) check(dom string, cpus []int) (*DomainPins, error) {
	p, ok := f.Doms[dom]
	if !ok {
		return nil, fmt.Errorf("%s: %w", dom, ErrDomainNotRunning)
	}
	if err := f.Fail[dom]; err != nil {
		return nil, err
	}
	for _, c := range cpus {
		if c < 0 || c >= f.CPUs {
			return nil, fmt.Errorf("CPU %d: the host has %d", c, f.CPUs)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("an empty CPU list")
	}
	return p, nil
}

// PinVCPU pins dom's vCPU vcpu to cpus.
func (f *FakePinner) PinVCPU(dom string, vcpu int, cpus []int) error {
	p, err := f.check(dom, cpus)
	if err != nil {
		return err
	}
	if vcpu < 0 || vcpu >= len(p.VCPUs) {
		return fmt.Errorf("vCPU %d: the domain has %d", vcpu, len(p.VCPUs))
	}
	p.VCPUs[vcpu] = slices.Clone(cpus)
	f.Writes++
	return nil
}

// PinEmulator pins dom's emulator threads to cpus.
func (f *FakePinner) PinEmulator(dom string, cpus []int) error {
	p, err := f.check(dom, cpus)
	if err != nil {
		return err
	}
	p.Emulator = slices.Clone(cpus)
	f.Writes++
	return nil
}

// String renders the domains by name, "dom: 0:1 emulator:0", then the
// writes.
func (f *FakePinner) String() string {
	names := make([]string, 0, len(f.Doms))
	for n := range f.Doms {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s: %s\n", n, f.Doms[n])
	}
	fmt.Fprintf(&b, "writes %d", f.Writes)
	return b.String()
}
