package agent

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// u32Prio is the priority of every sluice u32 filter; u32Table is the
// hash table they live in (800:), so filter N has handle 800::N.
const (
	u32Prio  = 1
	u32Table = 0x80000000
)

// NetlinkKernel is the real Kernel: netlink in one network namespace. It is
// the one place that converts between sluice's units (bits/s, bytes) and
// netlink's (HTB rates in bytes/s when read and when built here; buckets in
// scheduler ticks).
type NetlinkKernel struct {
	h *netlink.Handle
	// raw is a route socket in the same namespace for the one reading
	// the netlink library does not parse: HTB's class xstats.
	raw *nl.SocketHandle
	// nsIno is the inode of the namespace, which with an ifindex names
	// a device on this host (Qdisc.Device).
	nsIno uint64
}

// NewNetlinkKernel opens netlink in the named network namespace ("" for
// the current one).
func NewNetlinkKernel(nsName string) (*NetlinkKernel, error) {
	ns := netns.None()
	if nsName != "" {
		var err error
		if ns, err = netns.GetFromName(nsName); err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", nsName, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %q: %w", nsName, err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink in %q: %w", nsName, err)
	}
	return &NetlinkKernel{h: h, raw: &nl.SocketHandle{Socket: s}, nsIno: nsInode(int(ns))}, nil
}

// Close releases the netlink sockets.
func (k *NetlinkKernel) Close() {
	k.h.Close()
	k.raw.Close()
}

func (k *NetlinkKernel) link(dev string) (netlink.Link, error) {
	l, err := k.h.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("LinkByName %s: %w", dev, err)
	}
	return l, nil
}

// Master returns the name of the device dev is a port of (its bridge or
// bond), or "" when it has none.
func (k *NetlinkKernel) Master(dev string) (string, error) {
	l, err := k.link(dev)
	if err != nil {
		return "", err
	}
	idx := l.Attrs().MasterIndex
	if idx == 0 {
		return "", nil
	}
	m, err := k.h.LinkByIndex(idx)
	if err != nil {
		return "", fmt.Errorf("LinkByIndex %d (master of %s): %w", idx, dev, err)
	}
	return m.Attrs().Name, nil
}

func nlHandle(h Handle) uint32 { return uint32(h) }

// RootHTB implements Kernel.
func (k *NetlinkKernel) RootHTB(dev string) (bool, uint16, error) {
	l, err := k.link(dev)
	if err != nil {
		return false, 0, err
	}
	qs, err := k.h.QdiscList(l)
	if err != nil {
		return false, 0, err
	}
	for _, q := range qs {
		if q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		if h, ok := q.(*netlink.Htb); ok && h.Handle == netlink.MakeHandle(rootQdiscMajor, 0) {
			return true, uint16(h.Defcls), nil
		}
	}
	return false, 0, nil
}

// ReplaceRootHTB implements Kernel. HTB cannot change its default class in
// place, so an existing HTB root is deleted first.
func (k *NetlinkKernel) ReplaceRootHTB(dev string, def uint16) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	attrs := netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(rootQdiscMajor, 0), Parent: netlink.HANDLE_ROOT}
	if ok, _, _ := k.RootHTB(dev); ok {
		if err := k.h.QdiscDel(netlink.NewHtb(attrs)); err != nil {
			return fmt.Errorf("QdiscDel: %w", err)
		}
	}
	q := netlink.NewHtb(attrs)
	q.Defcls = uint32(def)
	return k.h.QdiscReplace(q)
}

// Classes implements Kernel.
func (k *NetlinkKernel) Classes(dev string) ([]ClassState, error) {
	l, err := k.link(dev)
	if err != nil {
		return nil, err
	}
	cs, err := k.h.ClassList(l, 0)
	if err != nil {
		return nil, err
	}
	var out []ClassState
	for _, c := range cs {
		h, ok := c.(*netlink.HtbClass)
		if !ok {
			continue
		}
		// netlink returns HTB rates in bytes/s.
		rateBytes, ceilBytes := h.Rate, h.Ceil
		parent := Handle(h.Parent)
		if h.Parent == netlink.HANDLE_ROOT {
			// A class made under qdisc 1: reads back as a root class.
			parent = MakeHandle(rootQdiscMajor, 0)
		}
		s := ClassState{HTBClass: HTBClass{
			ID: Handle(h.Handle), Parent: parent,
			RateBps: WireBps(rateBytes * 8), CeilBps: WireBps(ceilBytes * 8),
			BurstBytes: netlink.Xmitsize(rateBytes, h.Buffer), CburstBytes: netlink.Xmitsize(ceilBytes, h.Cbuffer),
			QuantumBytes: h.Quantum, Prio: h.Prio,
		}}
		if st := h.Statistics; st != nil {
			if st.Basic != nil {
				s.Bytes, s.Packets = st.Basic.Bytes, uint64(st.Basic.Packets)
			}
			if st.Queue != nil {
				s.Drops, s.Queued = uint64(st.Queue.Drops), uint64(st.Queue.Qlen)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// ClassTokens implements Kernel: the xstats of a class dump (struct
// tc_htb_xstats: lends, borrows, giants, tokens, ctokens; tokens in
// scheduler ticks of 64 ns), which the netlink library does not parse.
func (k *NetlinkKernel) ClassTokens(dev string) (map[Handle]int64, error) {
	l, err := k.link(dev)
	if err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETTCLASS, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: k.raw}
	req.AddData(&nl.TcMsg{Family: unix.AF_UNSPEC, Ifindex: int32(l.Attrs().Index)})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWTCLASS)
	if err != nil {
		return nil, err
	}
	out := map[Handle]int64{}
	for _, m := range msgs {
		if len(m) < nl.SizeofTcMsg {
			continue
		}
		tc := nl.DeserializeTcMsg(m)
		attrs, err := nl.ParseRouteAttrAsMap(m[nl.SizeofTcMsg:])
		if err != nil {
			return nil, err
		}
		kind, x := attrs[nl.TCA_KIND], attrs[nl.TCA_XSTATS]
		if string(bytes.TrimRight(kind.Value, "\x00")) != "htb" || len(x.Value) < htbXstatsLen {
			continue
		}
		ticks := int32(nl.NativeEndian().Uint32(x.Value[12:16]))
		out[Handle(tc.Handle)] = int64(ticks) << schedTickShift
	}
	return out, nil
}

// htbXstatsLen is the size of struct tc_htb_xstats; schedTickShift turns
// the kernel's scheduler ticks into ns (PSCHED_SHIFT).
const (
	htbXstatsLen   = 20
	schedTickShift = 6
)

// ReplaceClass implements Kernel.
func (k *NetlinkKernel) ReplaceClass(dev string, c HTBClass) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	rateBytes, ceilBytes := uint64(c.RateBps)/8, uint64(c.CeilBps)/8
	hc := &netlink.HtbClass{
		ClassAttrs: netlink.ClassAttrs{LinkIndex: l.Attrs().Index, Handle: nlHandle(c.ID), Parent: nlHandle(c.Parent)},
		Rate:       rateBytes, Ceil: ceilBytes,
		Buffer:  netlink.Xmittime(rateBytes, c.BurstBytes),
		Cbuffer: netlink.Xmittime(ceilBytes, c.CburstBytes),
		Quantum: c.QuantumBytes, Prio: c.Prio,
	}
	return k.h.ClassReplace(hc)
}

// DeleteClass implements Kernel.
func (k *NetlinkKernel) DeleteClass(dev string, id Handle) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	cs, err := k.h.ClassList(l, 0)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if Handle(c.Attrs().Handle) == id {
			return k.h.ClassDel(c)
		}
	}
	return nil
}

// Filters implements Kernel: the u32 filters of the root qdisc.
func (k *NetlinkKernel) Filters(dev string) ([]Filter, error) {
	l, err := k.link(dev)
	if err != nil {
		return nil, err
	}
	fs, err := k.h.FilterList(l, netlink.MakeHandle(rootQdiscMajor, 0))
	if err != nil {
		return nil, err
	}
	var out []Filter
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok {
			continue
		}
		node := u.Handle & 0xfff
		if node == 0 || u.Handle&0xfff00000 != u32Table {
			continue // the hash table itself
		}
		ff := Filter{Handle: node, ClassID: Handle(u.ClassId), AnyEtherType: u.Protocol == unix.ETH_P_ALL}
		if u.Sel != nil {
			for _, key := range u.Sel.Keys {
				ff.Keys = append(ff.Keys, U32Key{Mask: key.Mask, Val: key.Val, Off: key.Off})
			}
		}
		out = append(out, ff)
	}
	return out, nil
}

func (k *NetlinkKernel) u32(dev string, f Filter) (*netlink.U32, error) {
	l, err := k.link(dev)
	if err != nil {
		return nil, err
	}
	if f.Handle == 0 || f.Handle > 0xfff {
		return nil, errors.New("filter handle out of range 1..4095")
	}
	proto := uint16(unix.ETH_P_IP)
	if f.AnyEtherType {
		proto = unix.ETH_P_ALL
	}
	u := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.MakeHandle(rootQdiscMajor, 0),
		Priority: u32Prio, Protocol: proto, Handle: u32Table | f.Handle}, ClassId: nlHandle(f.ClassID)}
	// Keys of exactly their length: netlink sends cap(Keys) keys, and an
	// extra zero key (which matches anything) would read back as a
	// difference at every step.
	sel := &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: make([]netlink.TcU32Key, 0, len(f.Keys))}
	for _, key := range f.Keys {
		sel.Keys = append(sel.Keys, netlink.TcU32Key{Mask: key.Mask, Val: key.Val, Off: key.Off})
	}
	sel.Nkeys = uint8(len(sel.Keys))
	u.Sel = sel
	return u, nil
}

// ReplaceFilter implements Kernel.
func (k *NetlinkKernel) ReplaceFilter(dev string, f Filter) error {
	u, err := k.u32(dev, f)
	if err != nil {
		return err
	}
	return k.h.FilterReplace(u)
}

// DeleteFilter implements Kernel.
func (k *NetlinkKernel) DeleteFilter(dev string, handle uint32) error {
	u, err := k.u32(dev, Filter{Handle: handle})
	if err != nil {
		return err
	}
	u.Protocol = 0 // any: the kernel finds the filter by priority and handle
	return k.h.FilterDel(u)
}
