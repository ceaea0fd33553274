package agent

import (
	"fmt"
	"sort"
	"strings"
)

// FakeVF is a stateful in-memory VFKernel for tests (this kernel has no
// netdevsim): PFs and their VFs' rates. Like the drivers it refuses a
// min_tx_rate above a max_tx_rate that is set, a VF the PF lacks and a PF
// that does not exist, counts writes, and renders its state as text.
type FakeVF struct {
	PFs    map[string][]VFRate // PF device → rates by VF index
	Writes int
}

var _ VFKernel = (*FakeVF)(nil)

// NewFakeVF returns a FakeVF with the PFs named pf=N (N VFs, no rates).
func NewFakeVF(pfs ...string) *FakeVF {
	f := &FakeVF{PFs: map[string][]VFRate{}}
	for _, p := range pfs {
		name, n, _ := strings.Cut(p, "=")
		var k int
		fmt.Sscan(n, &k)
		f.PFs[name] = make([]VFRate, k)
	}
	return f
}

// VFRates implements VFKernel.
func (f *FakeVF) VFRates(pf string) (map[int]VFRate, error) {
	vfs, ok := f.PFs[pf]
	if !ok {
		return nil, fmt.Errorf("LinkByName %s: %w", pf, errFakeNoLink)
	}
	out := make(map[int]VFRate, len(vfs))
	for i, r := range vfs {
		out[i] = r
	}
	return out, nil
}

// SetVFRate implements VFKernel.
func (f *FakeVF) SetVFRate(pf string, vf int, r VFRate) error {
	vfs, ok := f.PFs[pf]
	switch {
	case !ok:
		return fmt.Errorf("LinkByName %s: %w", pf, errFakeNoLink)
	case vf < 0 || vf >= len(vfs):
		return fmt.Errorf("%s has no VF %d: invalid argument", pf, vf)
	case r.MaxTxMbps != 0 && r.MinTxMbps > r.MaxTxMbps:
		return fmt.Errorf("%s vf %d: min_tx_rate %d > max_tx_rate %d: invalid argument", pf, vf, r.MinTxMbps, r.MaxTxMbps)
	}
	vfs[vf] = r
	f.Writes++
	return nil
}

// String renders every VF that has a rate, PF by PF: "enp3s0f0 vf 3
// min 100 max 500".
func (f *FakeVF) String() string {
	var pfs []string
	for p := range f.PFs {
		pfs = append(pfs, p)
	}
	sort.Strings(pfs)
	var b strings.Builder
	for _, p := range pfs {
		for i, r := range f.PFs[p] {
			if r != (VFRate{}) {
				fmt.Fprintf(&b, "%s vf %d min %d max %d\n", p, i, r.MinTxMbps, r.MaxTxMbps)
			}
		}
	}
	if b.Len() == 0 {
		return "no VF rates\n"
	}
	return b.String()
}
