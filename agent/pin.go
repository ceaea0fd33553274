package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"sluice/cpuctl"
)

// Pinner is the part of the hypervisor that pins a running domain's
// threads to host CPUs (libvirt's virDomainPinVcpuFlags and
// virDomainPinEmulator on the live domain: virt.Pinner). Tests use
// FakePinner.
type Pinner interface {
	// Pins reads the running domain's pinning; an error wrapping
	// ErrDomainNotRunning when it does not run.
	Pins(domain string) (DomainPins, error)
	// PinVCPU pins the domain's vCPU vcpu to cpus (live).
	PinVCPU(domain string, vcpu int, cpus []int) error
	// PinEmulator pins the domain's emulator threads (QEMU's other
	// threads) to cpus (live).
	PinEmulator(domain string, cpus []int) error
}

// ErrDomainNotRunning is what a Pinner returns for a domain that does not
// run: it is skipped, not an error.
var ErrDomainNotRunning = errors.New("domain is not running")

// DomainPins is a running domain's pinning: the host CPUs each vCPU and
// its emulator threads may run on, and the domain's run-time id, which
// changes when it starts again (its pinning is then its definition's).
type DomainPins struct {
	ID       int     `json:"id"`
	VCPUs    [][]int `json:"vcpus"`
	Emulator []int   `json:"emulator"`
}

// String renders the pinning as virsh vcpupin does: "0:1 1:0-1 emulator:0".
func (p DomainPins) String() string {
	s := ""
	for i, c := range p.VCPUs {
		s += fmt.Sprintf("%d:%s ", i, cpuctl.FormatCPUs(c))
	}
	return s + "emulator:" + cpuctl.FormatCPUs(p.Emulator)
}

// DomainInventory names the hypervisor domain of a running VM of the
// policy (libvirt: the domain found by the VM's name or UUID). Without
// it a VM's domain is its name.
type DomainInventory interface {
	DomainName(vm string) (string, bool)
}

// PinAction is the desired pinning of one running domain while some VM of
// the host is latency-sensitive: vCPU i on Cores[i] (a latency-sensitive
// VM's own cores), every other vCPU and the emulator threads on Shared.
type PinAction struct {
	VM     string // the policy's VM; "" for a domain the policy does not name
	Domain string
	Cores  []int
	Shared []int
}

// want is the desired pinning of vCPU i.
func (p PinAction) want(i int) []int {
	if i < len(p.Cores) {
		return []int{p.Cores[i]}
	}
	return p.Shared
}

// PinRecheckNs is how often the agent reads the pinning of the host's
// domains back when nothing changed (a change behind its back is undone
// within it); a new decision (a VM that started or stopped, a new policy)
// is applied at once.
const PinRecheckNs = 1_000_000_000

// PinsOriginalsPath is the file in which the agent records each domain's
// pinning before it first changes it: `sluice agent uninstall` gives it
// back from there, also after a crash.
func PinsOriginalsPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("pins-originals-%s-%s.json", cluster, host))
}

// pinState is what the agent keeps between steps about pinning.
type pinState struct {
	orig  map[string]DomainPins // by domain: the pinning before sluice's
	key   string                // the last decision applied
	atNs  int64                 // when it was last applied
	ok    bool                  // it was applied without error
	taken bool                  // orig was read from the file
}

// decidePins is the pinning of every running domain of the host: none
// when no VM is pinned (recorded originals are then given back by Apply).
func decidePins(pin cpuctl.Pinning, vms []*cpuVM, inv Inventory, unnamed []string) []PinAction {
	if !pin.Pinned() {
		return nil
	}
	di, _ := inv.(DomainInventory)
	var out []PinAction
	for _, c := range vms {
		dom := c.vm.Name
		if di != nil {
			if d, ok := di.DomainName(c.vm.Name); ok {
				dom = d
			}
		}
		out = append(out, PinAction{VM: c.vm.Name, Domain: dom, Cores: pin.VMs[c.vm.Name], Shared: pin.Shared})
	}
	for _, d := range unnamed {
		out = append(out, PinAction{Domain: d, Shared: pin.Shared})
	}
	return out
}

// applyPins pins the running domains as decided, reading before writing;
// before its first change to a domain it records the domain's pinning in
// PinsPath. Recorded domains that are no longer to be pinned get their
// pinning back. It runs when the decision changed, after an error, or
// every PinRecheckNs, and returns the number of pinnings written.
func (a *Agent) applyPins(d Decision) (int, error) {
	pr := a.cfg.Pinner
	if pr == nil {
		return 0, nil
	}
	st := &a.pins
	if !st.taken {
		orig, err := readOriginals[DomainPins](a.cfg.PinsPath)
		if err != nil {
			return 0, err
		}
		st.orig, st.taken = orig, true
	}
	key := fmt.Sprint(d.Pins)
	if st.ok && key == st.key && d.NowNs-st.atNs < PinRecheckNs {
		return 0, nil
	}
	st.key, st.atNs = key, d.NowNs
	var errs, warns []error // warns: reported, not retried every step
	n := 0
	type todo struct {
		act PinAction
		cur DomainPins
	}
	var work []todo
	dirty := false
	wanted := map[string]bool{}
	for _, act := range d.Pins {
		wanted[act.Domain] = true
		cur, err := pr.Pins(act.Domain)
		if errors.Is(err, ErrDomainNotRunning) {
			if _, ok := st.orig[act.Domain]; ok {
				delete(st.orig, act.Domain)
				dirty = true
			}
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pin %s: %w", act.Domain, err))
			continue
		}
		if o, ok := st.orig[act.Domain]; !ok || o.ID != cur.ID {
			st.orig[act.Domain] = cur
			dirty = true
		}
		if act.Cores != nil && len(cur.VCPUs) != len(act.Cores) {
			warns = append(warns, fmt.Errorf("pin %s: the domain has %d vCPUs, the policy %d: vCPUs beyond them run on the shared cores %s",
				act.Domain, len(cur.VCPUs), len(act.Cores), cpuctl.FormatCPUs(act.Shared)))
		}
		work = append(work, todo{act, cur})
	}
	// Domains pinned before and not now: their pinning back.
	var back []string
	for dom := range st.orig {
		if !wanted[dom] {
			back = append(back, dom)
		}
	}
	sort.Strings(back)
	// The originals are on disk before the first change.
	if dirty {
		if err := writePins(a.cfg.PinsPath, st.orig); err != nil {
			errs = append(errs, fmt.Errorf("pin originals: %w", err))
			st.ok = false
			return 0, errors.Join(errs...)
		}
	}
	for _, w := range work {
		for i, c := range w.cur.VCPUs {
			if want := w.act.want(i); !slices.Equal(c, want) {
				if err := pr.PinVCPU(w.act.Domain, i, want); err != nil {
					errs = append(errs, fmt.Errorf("pin %s vCPU %d to %s: %w", w.act.Domain, i, cpuctl.FormatCPUs(want), err))
					continue
				}
				n++
			}
		}
		if !slices.Equal(w.cur.Emulator, w.act.Shared) {
			if err := pr.PinEmulator(w.act.Domain, w.act.Shared); err != nil {
				errs = append(errs, fmt.Errorf("pin %s emulator to %s: %w", w.act.Domain, cpuctl.FormatCPUs(w.act.Shared), err))
			} else {
				n++
			}
		}
	}
	for _, dom := range back {
		k, err := restorePins(pr, dom, st.orig[dom])
		n += k
		if err != nil {
			errs = append(errs, err)
			continue
		}
		delete(st.orig, dom)
		dirty = true
	}
	if dirty {
		if err := writePins(a.cfg.PinsPath, st.orig); err != nil {
			errs = append(errs, fmt.Errorf("pin originals: %w", err))
		}
	}
	st.ok = len(errs) == 0
	return n, errors.Join(append(errs, warns...)...)
}

// restorePins gives domain dom its recorded pinning o back, when it still
// runs as the process recorded (a domain that started again has its
// definition's pinning); it returns the number of pinnings written.
func restorePins(pr Pinner, dom string, o DomainPins) (int, error) {
	cur, err := pr.Pins(dom)
	if errors.Is(err, ErrDomainNotRunning) || err == nil && cur.ID != o.ID {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("unpin %s: %w", dom, err)
	}
	n := 0
	var errs []error
	for i, c := range cur.VCPUs {
		if i < len(o.VCPUs) && !slices.Equal(c, o.VCPUs[i]) {
			if err := pr.PinVCPU(dom, i, o.VCPUs[i]); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s vCPU %d to %s: %w", dom, i, cpuctl.FormatCPUs(o.VCPUs[i]), err))
				continue
			}
			n++
		}
	}
	if len(o.Emulator) > 0 && !slices.Equal(cur.Emulator, o.Emulator) {
		if err := pr.PinEmulator(dom, o.Emulator); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s emulator to %s: %w", dom, cpuctl.FormatCPUs(o.Emulator), err))
		} else {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// UninstallPins gives every domain recorded in the originals file at path
// (PinsOriginalsPath) its pinning back, one line per domain, and removes
// the file when all went well. It needs no agent: it also works after
// the agent crashed.
func UninstallPins(pr Pinner, path string) ([]string, error) {
	orig, err := readOriginals[DomainPins](path)
	if err != nil {
		return nil, err
	}
	doms := make([]string, 0, len(orig))
	for d := range orig {
		doms = append(doms, d)
	}
	sort.Strings(doms)
	var done []string
	var errs []error
	for _, d := range doms {
		o := orig[d]
		cur, err := pr.Pins(d)
		switch {
		case errors.Is(err, ErrDomainNotRunning):
			done = append(done, fmt.Sprintf("pins %s: not running, nothing to give back", d))
			continue
		case err == nil && cur.ID != o.ID:
			done = append(done, fmt.Sprintf("pins %s: started again since, it has its own pinning", d))
			continue
		}
		if _, err := restorePins(pr, d, o); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("pins %s: given back (%s)", d, o))
	}
	if len(errs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}

func writePins(path string, m map[string]DomainPins) error {
	if path == "" {
		return nil
	}
	return writeJSON(path, m)
}
