package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// FakeKernel is a stateful in-memory Kernel for tests. It counts writes,
// lets a test add traffic to a class's counters, and renders its state as
// text. It enforces HTB's rule that a class's parent must exist.
type FakeKernel struct {
	Devs   map[string]*FakeDev
	Writes int
}

// FakeDev is the state of one device.
type FakeDev struct {
	HTB     bool
	Default uint16
	Classes map[Handle]*ClassState
	Filters map[uint32]Filter
	// Root is the root qdisc when it is not sluice's HTB (zero: the
	// kernel's default, noqueue).
	Root Qdisc
	// Master is the kind of the device it is enslaved to ("" for none).
	Master string
	// Clsact tells whether the device has a clsact qdisc; VNICClass is
	// the class of sluice's classifier on it (0: none); OtherFilters
	// counts filters of others on the clsact.
	Clsact       bool
	VNICClass    Handle
	OtherFilters int
	// Debt holds classes' token debts in ns (ClassTokens: -Debt); a class
	// re-created starts without one.
	Debt map[Handle]int64
	// IFB marks an IFB device (EnsureIFB); Redirect is the device sluice's
	// filter on the clsact ingress redirects to ("" for none).
	IFB      bool
	Redirect string
}

var _ IngressKernel = (*FakeKernel)(nil)

// EnsureIFB implements IngressKernel.
func (k *FakeKernel) EnsureIFB(name string) error {
	if d, ok := k.Devs[name]; ok {
		if !d.IFB {
			return fmt.Errorf("%s exists and is not an IFB", name)
		}
		return nil
	}
	k.Writes++
	k.Devs[name] = &FakeDev{IFB: true}
	return nil
}

// DeleteIFB implements IngressKernel.
func (k *FakeKernel) DeleteIFB(name string) (bool, error) {
	d, ok := k.Devs[name]
	if !ok {
		return false, nil
	}
	if !d.IFB {
		return false, fmt.Errorf("%s is not sluice's IFB: left alone", name)
	}
	k.Writes++
	delete(k.Devs, name)
	return true, nil
}

// IngressRedirect implements IngressKernel.
func (k *FakeKernel) IngressRedirect(dev string) (string, bool, error) {
	d, err := k.dev(dev)
	if err != nil {
		return "", false, err
	}
	if _, ok := k.Devs[d.Redirect]; !ok {
		return "", false, nil
	}
	return d.Redirect, true, nil
}

// SetIngressRedirect implements IngressKernel.
func (k *FakeKernel) SetIngressRedirect(dev, ifb string) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	if _, err := k.dev(ifb); err != nil {
		return err
	}
	k.Writes++
	d.Clsact, d.Redirect = true, ifb
	return nil
}

// ClearIngressRedirect implements IngressKernel.
func (k *FakeKernel) ClearIngressRedirect(dev string) error {
	d, ok := k.Devs[dev]
	if !ok || d.Redirect == "" {
		return nil
	}
	k.Writes++
	d.Redirect = ""
	d.Clsact = d.OtherFilters > 0 || d.VNICClass != 0
	return nil
}

// NewFakeKernel returns a kernel whose devices have the default qdisc.
func NewFakeKernel(devs ...string) *FakeKernel {
	k := &FakeKernel{Devs: map[string]*FakeDev{}}
	for _, d := range devs {
		k.Devs[d] = &FakeDev{}
	}
	return k
}

// errFakeNoLink is the fake's error for a device that does not exist.
var errFakeNoLink = errors.New("Link not found")

func (k *FakeKernel) dev(name string) (*FakeDev, error) {
	d, ok := k.Devs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", errFakeNoLink, name)
	}
	return d, nil
}

// RootHTB implements Kernel.
func (k *FakeKernel) RootHTB(dev string) (bool, uint16, error) {
	d, err := k.dev(dev)
	if err != nil {
		return false, 0, err
	}
	return d.HTB, d.Default, nil
}

// ReplaceRootHTB implements Kernel.
func (k *FakeKernel) ReplaceRootHTB(dev string, def uint16) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	k.Writes++
	if !d.HTB {
		d.Classes = map[Handle]*ClassState{}
		d.Filters = map[uint32]Filter{}
	}
	d.HTB, d.Default, d.Root = true, def, Qdisc{}
	return nil
}

// RootQdisc implements Kernel.
func (k *FakeKernel) RootQdisc(dev string) (Qdisc, error) {
	d, err := k.dev(dev)
	if err != nil {
		return Qdisc{}, err
	}
	id := "fake-" + dev
	switch {
	case d.HTB:
		return Qdisc{Kind: "htb", Handle: MakeHandle(rootQdiscMajor, 0).String(), Device: id}, nil
	case d.Root.Kind == "":
		return Qdisc{Kind: "noqueue", Handle: "0:0", Default: true, Device: id}, nil
	}
	q := d.Root
	q.Device = id
	return q, nil
}

// RestoreRoot implements Kernel.
func (k *FakeKernel) RestoreRoot(dev string, q Qdisc) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	if _, err := restorable(q); err != nil {
		return err
	}
	k.Writes++
	d.HTB, d.Default, d.Classes, d.Filters, d.Root = false, 0, nil, nil, q
	return nil
}

// MasterKind implements Kernel.
func (k *FakeKernel) MasterKind(dev string) (string, error) {
	d, err := k.dev(dev)
	if err != nil {
		return "", err
	}
	return d.Master, nil
}

// VNICClass implements Kernel.
func (k *FakeKernel) VNICClass(dev string) (Handle, bool, error) {
	d, err := k.dev(dev)
	if err != nil {
		return 0, false, err
	}
	return d.VNICClass, d.VNICClass != 0, nil
}

// SetVNICClass implements Kernel.
func (k *FakeKernel) SetVNICClass(dev string, class Handle) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	k.Writes++
	d.Clsact, d.VNICClass = true, class
	return nil
}

// ClearVNICClass implements Kernel.
func (k *FakeKernel) ClearVNICClass(dev string) error {
	d, ok := k.Devs[dev]
	if !ok || !d.Clsact || d.VNICClass == 0 {
		return nil
	}
	k.Writes++
	d.VNICClass = 0
	d.Clsact = d.OtherFilters > 0 || d.Redirect != ""
	return nil
}

// Classes implements Kernel.
func (k *FakeKernel) Classes(dev string) ([]ClassState, error) {
	d, err := k.dev(dev)
	if err != nil {
		return nil, err
	}
	var out []ClassState
	for _, c := range d.Classes {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ClassTokens implements Kernel.
func (k *FakeKernel) ClassTokens(dev string) (map[Handle]int64, error) {
	d, err := k.dev(dev)
	if err != nil {
		return nil, err
	}
	out := map[Handle]int64{}
	for id, debt := range d.Debt {
		out[id] = -debt
	}
	return out, nil
}

// ReplaceClass implements Kernel.
func (k *FakeKernel) ReplaceClass(dev string, c HTBClass) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	if !d.HTB {
		return fmt.Errorf("no HTB qdisc on %s", dev)
	}
	if _, ok := d.Classes[c.Parent]; !ok && c.Parent.Minor() != 0 {
		return fmt.Errorf("parent %s of %s does not exist", c.Parent, c.ID)
	}
	k.Writes++
	if old, ok := d.Classes[c.ID]; ok {
		if old.Parent != c.Parent {
			return fmt.Errorf("class %s: cannot change parent", c.ID)
		}
		old.HTBClass = c
		return nil
	}
	d.Classes[c.ID] = &ClassState{HTBClass: c}
	return nil
}

// DeleteClass implements Kernel.
func (k *FakeKernel) DeleteClass(dev string, id Handle) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	for _, c := range d.Classes {
		if c.Parent == id {
			return fmt.Errorf("class %s has children", id)
		}
	}
	for _, f := range d.Filters {
		if f.ClassID == id {
			return fmt.Errorf("class %s in use by filter %d", id, f.Handle)
		}
	}
	k.Writes++
	delete(d.Classes, id)
	delete(d.Debt, id)
	return nil
}

// Filters implements Kernel.
func (k *FakeKernel) Filters(dev string) ([]Filter, error) {
	d, err := k.dev(dev)
	if err != nil {
		return nil, err
	}
	var out []Filter
	for _, f := range d.Filters {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out, nil
}

// ReplaceFilter implements Kernel.
func (k *FakeKernel) ReplaceFilter(dev string, f Filter) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	if _, ok := d.Classes[f.ClassID]; !ok {
		return fmt.Errorf("filter %d: class %s does not exist", f.Handle, f.ClassID)
	}
	for _, h := range d.Filters {
		if h.AnyEtherType != f.AnyEtherType {
			// The kernel keeps one protocol per priority (EINVAL).
			return fmt.Errorf("filter %d: filter %d has the other protocol at this priority", f.Handle, h.Handle)
		}
	}
	k.Writes++
	d.Filters[f.Handle] = f
	return nil
}

// DeleteFilter implements Kernel.
func (k *FakeKernel) DeleteFilter(dev string, h uint32) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	k.Writes++
	delete(d.Filters, h)
	return nil
}

// AddTraffic adds bytes (and bytes/1500 packets) to a class's counters.
func (k *FakeKernel) AddTraffic(dev string, id Handle, bytes uint64) error {
	d, err := k.dev(dev)
	if err != nil {
		return err
	}
	c, ok := d.Classes[id]
	if !ok {
		return fmt.Errorf("no class %s on %s", id, dev)
	}
	c.Bytes += bytes
	c.Packets += bytes / 1500
	return nil
}

// String renders every device: qdisc, classes (rates in Mbit/s) and filters.
func (k *FakeKernel) String() string {
	var b strings.Builder
	var names []string
	for n := range k.Devs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := k.Devs[n]
		if d.Clsact {
			fmt.Fprintf(&b, "%s: clsact", n)
			if d.VNICClass != 0 {
				fmt.Fprintf(&b, ", ingress bpf sets priority %s", d.VNICClass)
			}
			if d.Redirect != "" {
				fmt.Fprintf(&b, ", ingress u32 mirred redirect to %s", d.Redirect)
			}
			if d.OtherFilters > 0 {
				fmt.Fprintf(&b, ", %d other filters", d.OtherFilters)
			}
			b.WriteString("\n")
		}
		if d.IFB {
			fmt.Fprintf(&b, "%s: ifb\n", n)
		}
		if !d.HTB {
			q, _ := k.RootQdisc(n)
			if q.Default && !d.Clsact {
				fmt.Fprintf(&b, "%s: default qdisc\n", n)
			} else if !q.Default {
				var opts bytes.Buffer
				_ = json.Compact(&opts, q.Options)
				fmt.Fprintf(&b, "%s: root %s %s %s\n", n, q.Kind, q.Handle, opts.String())
			}
			continue
		}
		fmt.Fprintf(&b, "%s: htb 1: default %x\n", n, d.Default)
		cs, _ := k.Classes(n)
		for _, c := range cs {
			prio := ""
			if c.Prio != 0 {
				prio = fmt.Sprintf(" prio %d", c.Prio)
			}
			fmt.Fprintf(&b, "  class %s parent %s rate %s ceil %s burst %d cburst %d quantum %d%s\n",
				c.ID, c.Parent, mbit(float64(c.RateBps)), mbit(float64(c.CeilBps)), c.BurstBytes, c.CburstBytes, c.QuantumBytes, prio)
		}
		fs, _ := k.Filters(n)
		for _, f := range fs {
			var keys []string
			for _, key := range f.Keys {
				keys = append(keys, fmt.Sprintf("%08x/%08x@%d", key.Val, key.Mask, key.Off))
			}
			proto := ""
			if f.AnyEtherType {
				proto = " protocol all"
			}
			fmt.Fprintf(&b, "  filter %d%s -> %s match %s\n", f.Handle, proto, f.ClassID, strings.Join(keys, " "))
		}
	}
	return b.String()
}

func mbit(bps float64) string { return fmt.Sprintf("%.1fMbit", bps/1e6) }
