package agent

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// skbPriorityOff is the offset of priority in struct __sk_buff (the 9th
// u32: len, pkt_type, mark, queue_mapping, protocol, vlan_present,
// vlan_tci, vlan_proto, priority).
const skbPriorityOff = 32

// tcActOK is TC_ACT_OK: a direct-action program lets the packet pass.
const tcActOK = 0

// vnicFilterPrio and vnicFilterHandle place sluice's classifier on a
// vNIC's clsact ingress; vnicFilterPrefix starts its name, which carries
// the class ("sluice-prio-1:100").
const (
	vnicFilterPrio   = 1
	vnicFilterHandle = 1
	vnicFilterPrefix = "sluice-prio-"
)

// VNICProgram is the eBPF sched_cls program (direct action) that sluice
// attaches on a vNIC's host-side device: it sets skb->priority to class
// and lets the packet pass. HTB takes a packet whose priority is one of
// its classes' ids straight into that class, before any filter, so every
// packet the VM sends (IPv4, IPv6, ARP, VLAN-tagged) lands in the vNIC's
// class on the uplink, and a guest cannot choose another class by setting
// its socket's priority: the program overwrites it.
func VNICProgram(class Handle) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm32(asm.R0, int32(class)),
		asm.StoreMem(asm.R1, skbPriorityOff, asm.R0, asm.Word),
		asm.Mov.Imm(asm.R0, tcActOK),
		asm.Return(),
	}
}

var memlock sync.Once

// hostOrder is the machine's byte order as a named order (asm's marshaling
// does not take binary.NativeEndian).
func hostOrder() binary.ByteOrder {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return binary.LittleEndian
	}
	return binary.BigEndian
}

func vnicFilterName(class Handle) string { return vnicFilterPrefix + class.String() }

func (k *NetlinkKernel) clsactFilters(l netlink.Link) ([]netlink.Filter, error) {
	var out []netlink.Filter
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := k.h.FilterList(l, parent)
		if err != nil {
			return nil, fmt.Errorf("FilterList: %w", err)
		}
		out = append(out, fs...)
	}
	return out, nil
}

func isSluiceBPF(f netlink.Filter) (*netlink.BpfFilter, bool) {
	b, ok := f.(*netlink.BpfFilter)
	return b, ok && b.Parent == netlink.HANDLE_MIN_INGRESS && strings.HasPrefix(b.Name, vnicFilterPrefix)
}

// VNICClass implements Kernel: sluice's filter is read back by its name
// (the class) and checked by the tag of its program.
func (k *NetlinkKernel) VNICClass(dev string) (Handle, bool, error) {
	l, err := k.link(dev)
	if err != nil {
		return 0, false, err
	}
	fs, err := k.clsactFilters(l)
	if err != nil {
		return 0, false, err
	}
	for _, f := range fs {
		b, ok := isSluiceBPF(f)
		if !ok {
			continue
		}
		class, err := ParseHandle(strings.TrimPrefix(b.Name, vnicFilterPrefix))
		if err != nil {
			continue
		}
		if ok, err := VNICProgram(class).HasTag(b.Tag, hostOrder()); err != nil || !ok || !b.DirectAction {
			return 0, false, nil // not the program sluice would attach: replace it
		}
		return class, true, nil
	}
	return 0, false, nil
}

// SetVNICClass implements Kernel.
func (k *NetlinkKernel) SetVNICClass(dev string, class Handle) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := k.h.QdiscReplace(q); err != nil {
		return fmt.Errorf("QdiscReplace clsact: %w", err)
	}
	memlock.Do(func() { _ = rlimit.RemoveMemlock() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "sluice_prio", Type: ebpf.SchedCLS, Instructions: VNICProgram(class), License: "Apache-2.0"})
	if err != nil {
		return fmt.Errorf("loading the classifier program: %w", err)
	}
	defer prog.Close() // the filter holds its own reference
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
		Handle: vnicFilterHandle, Priority: vnicFilterPrio, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: vnicFilterName(class), DirectAction: true}
	if err := k.h.FilterReplace(f); err != nil {
		return fmt.Errorf("FilterReplace bpf: %w", err)
	}
	return nil
}

// ClearVNICClass implements Kernel.
func (k *NetlinkKernel) ClearVNICClass(dev string) error {
	return k.clearClsact(dev, "bpf", func(f netlink.Filter) bool { _, ok := isSluiceBPF(f); return ok })
}
