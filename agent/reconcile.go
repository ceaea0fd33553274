package agent

import (
	"errors"
	"fmt"
	"slices"
	"sort"
)

// Changes counts what one reconcile wrote.
type Changes struct {
	Qdisc, ClassesSet, ClassesDeleted, FiltersSet, FiltersDeleted int
	// VNICsSet counts classifiers attached or replaced at vNICs,
	// VNICsCleared those removed.
	VNICsSet, VNICsCleared int
	// CPUFiles counts VM cgroup files written (Config.Cgroups).
	CPUFiles int
	// CPUPins counts vCPU and emulator pinnings written (Config.Pinner).
	CPUPins int
	// ClassesRenewed counts classes re-created to clear a token debt
	// (RenewDebtNs); each is also counted as deleted and set.
	ClassesRenewed int
	// VFs counts SR-IOV VFs whose rates were set or given back.
	VFs int
}

// Add adds o's counts to c.
func (c *Changes) Add(o Changes) {
	c.Qdisc += o.Qdisc
	c.ClassesSet += o.ClassesSet
	c.ClassesDeleted += o.ClassesDeleted
	c.ClassesRenewed += o.ClassesRenewed
	c.FiltersSet += o.FiltersSet
	c.FiltersDeleted += o.FiltersDeleted
	c.VNICsSet += o.VNICsSet
	c.VNICsCleared += o.VNICsCleared
	c.CPUFiles += o.CPUFiles
	c.CPUPins += o.CPUPins
	c.VFs += o.VFs
}

// Total is the number of kernel writes.
func (c Changes) Total() int {
	return c.Qdisc + c.ClassesSet + c.ClassesDeleted + c.FiltersSet + c.FiltersDeleted + c.VNICsSet + c.VNICsCleared + c.CPUFiles + c.CPUPins + c.VFs
}

func (c Changes) String() string {
	s := fmt.Sprintf("qdisc=%d classes=%d/-%d filters=%d/-%d vnics=%d/-%d", c.Qdisc, c.ClassesSet, c.ClassesDeleted, c.FiltersSet, c.FiltersDeleted,
		c.VNICsSet, c.VNICsCleared)
	if c.ClassesRenewed > 0 {
		s += fmt.Sprintf(" renewed=%d", c.ClassesRenewed)
	}
	if c.CPUFiles > 0 {
		s += fmt.Sprintf(" cpu=%d", c.CPUFiles)
	}
	if c.CPUPins > 0 {
		s += fmt.Sprintf(" pins=%d", c.CPUPins)
	}
	if c.VFs > 0 {
		s += fmt.Sprintf(" vfs=%d", c.VFs)
	}
	return s
}

// Reconcile makes dev's traffic control state equal to the wanted classes
// (parents first) and filters: it reads what is there, replaces what
// differs and deletes what is not wanted. Applying twice changes nothing.
// have may be passed when the caller just read the classes (nil: read).
func Reconcile(k Kernel, dev string, defaultMinor uint16, want []HTBClass, filters []Filter, have []ClassState) (Changes, error) {
	var ch Changes
	ok, def, err := k.RootHTB(dev)
	if err != nil {
		return ch, fmt.Errorf("QdiscList %s: %w", dev, err)
	}
	if !ok || def != defaultMinor {
		if err := k.ReplaceRootHTB(dev, defaultMinor); err != nil {
			return ch, fmt.Errorf("QdiscReplace %s: %w", dev, err)
		}
		ch.Qdisc++
		have = nil
	}
	if have == nil {
		have, err = k.Classes(dev)
		if err != nil {
			return ch, fmt.Errorf("ClassList %s: %w", dev, err)
		}
	}
	byID := map[Handle]ClassState{}
	for _, c := range have {
		byID[c.ID] = c
	}
	var errs []error
	// The filters are read first: a class re-created (a new parent, or
	// to clear its debt) must lose the filters bound to it for a moment.
	hf, ferr := k.Filters(dev)
	hfBy := map[uint32]Filter{}
	for _, f := range hf {
		hfBy[f.Handle] = f
	}
	parents := map[Handle]bool{}
	for _, w := range want {
		parents[w.Parent] = true
	}
	// Token balances are read only when a leaf's rate is raised.
	var tokens map[Handle]int64
	inDebt := func(id Handle) bool {
		if tokens == nil {
			var err error
			if tokens, err = k.ClassTokens(dev); err != nil {
				errs = append(errs, fmt.Errorf("HTB class xstats %s: %w", dev, err))
				tokens = map[Handle]int64{}
			}
		}
		return tokens[id] < -RenewDebtNs
	}
	wanted := map[Handle]bool{}
	for _, w := range want {
		wanted[w.ID] = true
		h, exists := byID[w.ID]
		if exists && sameClass(h.HTBClass, w) {
			continue
		}
		renew := exists && ferr == nil && h.Parent == w.Parent && !parents[w.ID] && w.RateBps > h.RateBps && inDebt(w.ID)
		if exists && (h.Parent != w.Parent || renew) {
			for _, f := range hf {
				if _, ok := hfBy[f.Handle]; !ok || f.ClassID != w.ID {
					continue
				}
				if err := k.DeleteFilter(dev, f.Handle); err != nil {
					errs = append(errs, fmt.Errorf("FilterDel %s %d: %w", dev, f.Handle, err))
					continue
				}
				delete(hfBy, f.Handle)
				ch.FiltersDeleted++
			}
			if err := k.DeleteClass(dev, w.ID); err != nil {
				errs = append(errs, fmt.Errorf("ClassDel %s %s: %w", dev, w.ID, err))
				continue
			}
			ch.ClassesDeleted++
			if renew {
				ch.ClassesRenewed++
			}
		}
		if err := k.ReplaceClass(dev, w); err != nil {
			errs = append(errs, fmt.Errorf("ClassReplace %s %s: %w", dev, w.ID, err))
			continue
		}
		ch.ClassesSet++
	}
	if ferr != nil {
		errs = append(errs, fmt.Errorf("FilterList %s: %w", dev, ferr))
	} else {
		// The kernel keeps one protocol per priority: filters of the other
		// one (an older agent's IPv4-only filters on an IFB) go first.
		if len(filters) > 0 {
			for _, h := range hf {
				if _, ok := hfBy[h.Handle]; !ok || h.AnyEtherType == filters[0].AnyEtherType {
					continue
				}
				if err := k.DeleteFilter(dev, h.Handle); err != nil {
					errs = append(errs, fmt.Errorf("FilterDel %s %d: %w", dev, h.Handle, err))
					continue
				}
				delete(hfBy, h.Handle)
				ch.FiltersDeleted++
			}
		}
		wf := map[uint32]bool{}
		for _, f := range filters {
			wf[f.Handle] = true
			if h, ok := hfBy[f.Handle]; ok && sameFilter(h, f) {
				continue
			}
			if err := k.ReplaceFilter(dev, f); err != nil {
				errs = append(errs, fmt.Errorf("FilterReplace %s %d: %w", dev, f.Handle, err))
				continue
			}
			ch.FiltersSet++
		}
		for _, f := range hf {
			if _, ok := hfBy[f.Handle]; ok && !wf[f.Handle] {
				if err := k.DeleteFilter(dev, f.Handle); err != nil {
					errs = append(errs, fmt.Errorf("FilterDel %s %d: %w", dev, f.Handle, err))
					continue
				}
				ch.FiltersDeleted++
			}
		}
	}
	// Delete unwanted classes, children before parents.
	var gone []ClassState
	for _, c := range have {
		if !wanted[c.ID] {
			gone = append(gone, c)
		}
	}
	depth := func(c ClassState) int {
		d := 0
		for p := c.Parent; d < 16; d++ {
			pc, ok := byID[p]
			if !ok {
				break
			}
			p = pc.Parent
		}
		return d
	}
	sort.SliceStable(gone, func(i, j int) bool { return depth(gone[i]) > depth(gone[j]) })
	for _, c := range gone {
		if err := k.DeleteClass(dev, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("ClassDel %s %s: %w", dev, c.ID, err))
			continue
		}
		ch.ClassesDeleted++
	}
	return ch, errors.Join(errs...)
}

// RenewDebtNs is the token debt above which Reconcile re-creates a leaf
// class whose guaranteed rate it raises, instead of changing the rate in
// place. HTB keeps a class's debt in time across a rate change and lets
// only real time pay it back: a class that sent one 64 KB GSO packet at the
// floor rate (minRate, 30 kbit/s on a 300 Mbps uplink) owes 17 s, and for
// that long it gets only what it can borrow, whatever its new rate. A
// re-created class starts with a full bucket; the packets in its queue are
// dropped (its sender sends them again). Below this debt (a packet at
// 2.6 Mbit/s or more) the change is made in place.
const RenewDebtNs = int64(200e6)

// sameClass compares what sluice sets. Rates must match to 0.1% (netlink
// keeps bytes/s); buckets to 2% (the kernel keeps them as transmit times).
func sameClass(a, b HTBClass) bool {
	near := func(x, y float64, tol float64) bool {
		d := x - y
		if d < 0 {
			d = -d
		}
		return d <= tol*max(x, y)+8
	}
	return a.Parent == b.Parent && a.Prio == b.Prio && a.QuantumBytes == b.QuantumBytes &&
		near(float64(a.RateBps), float64(b.RateBps), 0.001) && near(float64(a.CeilBps), float64(b.CeilBps), 0.001) &&
		near(float64(a.BurstBytes), float64(b.BurstBytes), 0.02) && near(float64(a.CburstBytes), float64(b.CburstBytes), 0.02)
}

func sameFilter(a, b Filter) bool {
	return a.Handle == b.Handle && a.ClassID == b.ClassID && slices.Equal(a.Keys, b.Keys) && a.AnyEtherType == b.AnyEtherType
}
