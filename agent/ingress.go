package agent

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Inbound shaping (issue 27). What enters through an uplink towards the
// host's VMs is shaped on an IFB device of the uplink: a u32 filter that
// matches every packet (one key with mask 0; u32 rather than matchall,
// which not every kernel has built in: this lab's has not) on the
// uplink's clsact ingress redirects it (mirred egress redirect) to the
// IFB, whose root is an HTB tree like the uplink's own,
// built from the inbound tree of the derivation (entitle.Desired.Inbound),
// with one u32 filter per vNIC matching its MAC address as destination
// (or, where the inventory knows no MAC, its IPv4 address: the egress
// tree's host classes match the source; this is the mirror).
// After the IFB's HTB the packet goes on up the uplink's ingress path
// (the bridge, then the VM). Only uplinks with a vNIC or class that has an
// ingress setting get an IFB: a policy without `ingress` changes nothing
// on the host.

// IngressKernel is the part of the kernel that inbound shaping needs
// besides Kernel (which programs the IFB's HTB tree).
type IngressKernel interface {
	// EnsureIFB creates the IFB device name when it is missing and sets
	// it up.
	EnsureIFB(name string) error
	// DeleteIFB removes the IFB device name and reports whether it was
	// there; one that is gone is not an error.
	DeleteIFB(name string) (bool, error)
	// IngressRedirect reports the device that sluice's filter on dev's
	// clsact ingress redirects to; ok is false when there is none.
	IngressRedirect(dev string) (ifb string, ok bool, err error)
	// SetIngressRedirect adds a clsact qdisc to dev when missing and
	// puts (or replaces) sluice's filter on its ingress (u32, matching
	// every packet) with a mirred egress redirect to ifb.
	SetIngressRedirect(dev, ifb string) error
	// ClearIngressRedirect removes sluice's redirect from dev, and dev's
	// clsact qdisc when no other filter is left on it. A device that is
	// gone or has no redirect is not an error.
	ClearIngressRedirect(dev string) error
}

// IFBName is the IFB device that shapes what uplink device dev receives:
// "sl-in-" and dev when that fits the kernel's 15 characters, else
// "sl-in-" and a hash of dev. The prefix is the lab's, on real hosts too,
// so that every device sluice creates is recognisably its own.
func IFBName(dev string) string {
	const prefix = "sl-in-"
	if len(prefix)+len(dev) <= unix.IFNAMSIZ-1 {
		return prefix + dev
	}
	h := fnv.New32a()
	h.Write([]byte(dev))
	return fmt.Sprintf("%s%08x", prefix, h.Sum32())
}

// dstIPKey matches an IPv4 destination address.
func dstIPKey(a netip.Addr) U32Key {
	k := srcIPKey(a)
	k.Off = 16
	return k
}

// dstMACKeys match an Ethernet destination address: its six bytes lie
// 14 to 9 bytes before the network header, which u32 compares as the
// aligned words at -16 (the address's first two bytes, the low half) and
// -12 (the other four), as tc's `match ether dst` does.
func dstMACKeys(mac net.HardwareAddr) []U32Key {
	return []U32Key{
		{Mask: 0x0000ffff, Val: uint32(mac[0])<<8 | uint32(mac[1]), Off: -16},
		{Mask: 0xffffffff, Val: uint32(mac[2])<<24 | uint32(mac[3])<<16 | uint32(mac[4])<<8 | uint32(mac[5]), Off: -12},
	}
}

// etherTypeIPv4Key matches IPv4 frames: the word at -4 holds the source
// MAC's last two bytes and the EtherType.
var etherTypeIPv4Key = U32Key{Mask: 0x0000ffff, Val: unix.ETH_P_IP, Off: -4}

// anyEtherType makes an IFB's filters see every frame: IPv6 and ARP
// arrive there as well as IPv4. A filter that reads the IPv4 header (a
// key at a non-negative offset) checks the EtherType first; one that
// matches a MAC address needs no check.
func anyEtherType(fs []Filter) {
	for i := range fs {
		fs[i].AnyEtherType = true
		if slices.ContainsFunc(fs[i].Keys, func(k U32Key) bool { return k.Off >= 0 }) {
			fs[i].Keys = append([]U32Key{etherTypeIPv4Key}, fs[i].Keys...)
		}
	}
}

// srcPortKey is the source-port key of the destination-port key k (a
// block of dstPortKeys): the same block, in the upper half of the word.
func srcPortKey(k U32Key) U32Key {
	return U32Key{Mask: k.Mask << 16, Val: k.Val << 16, Off: k.Off}
}

// inboundFilterHandle is the u32 handle of the filter of the vNIC with
// inventory index k on an IFB (below hostFilterBase).
func inboundFilterHandle(k int) uint32 { return uint32(1 + k) }

const (
	ingressFilterPrio   = 1
	ingressFilterHandle = 1
)

// ingressClsact returns the device's clsact qdisc, nil when it has none.
func (k *NetlinkKernel) ingressClsact(l netlink.Link) (netlink.Qdisc, error) {
	qs, err := k.h.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("QdiscList: %w", err)
	}
	for _, q := range qs {
		if _, ok := q.(*netlink.Clsact); ok {
			return q, nil
		}
	}
	return nil, nil
}

// sluiceRedirect returns the redirect target's ifindex of f when it is
// sluice's redirect on a clsact ingress: the u32 filter of
// ingressFilterPrio whose action is a mirred egress redirect.
func sluiceRedirect(f netlink.Filter) (int, bool) {
	u, ok := f.(*netlink.U32)
	if !ok || u.Parent != netlink.HANDLE_MIN_INGRESS || u.Priority != ingressFilterPrio || u.Handle&0xfff != ingressFilterHandle {
		return 0, false
	}
	for _, a := range u.Actions {
		if r, ok := a.(*netlink.MirredAction); ok && r.MirredAction == netlink.TCA_EGRESS_REDIR {
			return r.Ifindex, true
		}
	}
	return 0, false
}

// EnsureIFB implements IngressKernel.
func (k *NetlinkKernel) EnsureIFB(name string) error {
	l, err := k.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("LinkByName %s: %w", name, err)
		}
		if err := k.h.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: 1000}}); err != nil {
			return fmt.Errorf("LinkAdd ifb %s: %w (is the ifb module available?)", name, err)
		}
		if l, err = k.h.LinkByName(name); err != nil {
			return fmt.Errorf("LinkByName %s: %w", name, err)
		}
	}
	if l.Type() != "ifb" {
		return fmt.Errorf("%s exists and is a %s device, not an IFB", name, l.Type())
	}
	if l.Attrs().Flags&unix.IFF_UP == 0 {
		if err := k.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("LinkSetUp %s: %w", name, err)
		}
	}
	return nil
}

// DeleteIFB implements IngressKernel.
func (k *NetlinkKernel) DeleteIFB(name string) (bool, error) {
	l, err := k.linkIfAny(name)
	if err != nil || l == nil {
		return false, err
	}
	if l.Type() != "ifb" {
		return false, fmt.Errorf("%s is a %s device, not sluice's IFB: left alone", name, l.Type())
	}
	if err := k.h.LinkDel(l); err != nil {
		return false, fmt.Errorf("LinkDel %s: %w", name, err)
	}
	return true, nil
}

// IngressRedirect implements IngressKernel.
func (k *NetlinkKernel) IngressRedirect(dev string) (string, bool, error) {
	l, err := k.link(dev)
	if err != nil {
		return "", false, err
	}
	fs, err := k.h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return "", false, fmt.Errorf("FilterList: %w", err)
	}
	for _, f := range fs {
		if idx, ok := sluiceRedirect(f); ok {
			t, err := k.h.LinkByIndex(idx)
			if err != nil {
				return "", false, nil // redirects to a device that is gone: replace it
			}
			return t.Attrs().Name, true, nil
		}
	}
	return "", false, nil
}

// SetIngressRedirect implements IngressKernel.
func (k *NetlinkKernel) SetIngressRedirect(dev, ifb string) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	t, err := k.h.LinkByName(ifb)
	if err != nil {
		return fmt.Errorf("LinkByName %s: %w", ifb, err)
	}
	q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := k.h.QdiscReplace(q); err != nil {
		return fmt.Errorf("QdiscReplace clsact %s: %w", dev, err)
	}
	m := netlink.NewMirredAction(t.Attrs().Index)
	m.MirredAction = netlink.TCA_EGRESS_REDIR
	m.Attrs().Action = netlink.TC_ACT_STOLEN
	f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
		Handle: u32Table | ingressFilterHandle, Priority: ingressFilterPrio, Protocol: unix.ETH_P_ALL},
		Sel:     &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0}}},
		Actions: []netlink.Action{m}}
	if err := k.h.FilterReplace(f); err != nil {
		return fmt.Errorf("FilterReplace u32 mirred %s -> %s: %w (the kernel needs cls_u32 and act_mirred)", dev, ifb, err)
	}
	return nil
}

// ClearIngressRedirect implements IngressKernel.
func (k *NetlinkKernel) ClearIngressRedirect(dev string) error {
	return k.clearClsact(dev, "u32 redirect", func(f netlink.Filter) bool { _, ok := sluiceRedirect(f); return ok })
}

// clearClsact deletes the filters of dev's clsact qdisc that ours
// recognises (what names them in errors), and the clsact qdisc when no
// other filter is left on it. A device that is gone, or has no clsact, is
// not an error.
func (k *NetlinkKernel) clearClsact(dev, what string, ours func(netlink.Filter) bool) error {
	l, err := k.linkIfAny(dev)
	if err != nil || l == nil {
		return err // nil: the device is gone, and its filters with it
	}
	clsact, err := k.ingressClsact(l)
	if err != nil || clsact == nil {
		return err
	}
	fs, err := k.clsactFilters(l)
	if err != nil {
		return err
	}
	others := 0
	for _, f := range fs {
		if !ours(f) {
			if f.Attrs().Handle != 0 { // not a chain's head entry
				others++
			}
			continue
		}
		if err := k.h.FilterDel(f); err != nil {
			return fmt.Errorf("FilterDel %s %s: %w", what, dev, err)
		}
	}
	if others == 0 {
		if err := k.h.QdiscDel(clsact); err != nil {
			return fmt.Errorf("QdiscDel clsact %s: %w", dev, err)
		}
	}
	return nil
}

// ingressKernel returns the kernel's inbound side, or why there is none.
func (a *Agent) ingressKernel() (IngressKernel, error) {
	k, ok := a.cfg.Kernel.(IngressKernel)
	if !ok {
		return nil, errors.New("the policy gives ingress settings, but this kernel interface cannot shape inbound traffic (no IFB support)")
	}
	return k, nil
}

// takeIngress records, before its first change, that sluice shapes what
// uplink receives on the IFB ifb, and creates the IFB.
func (a *Agent) takeIngress(ifb, uplink string) error {
	k, err := a.ingressKernel()
	if err != nil {
		return err
	}
	if !a.taken[ifb] {
		if a.rec.Ingress == nil {
			a.rec.Ingress = map[string]string{}
		}
		if a.rec.Ingress[ifb] != uplink {
			a.rec.Ingress[ifb] = uplink
			if err := a.saveRecord(); err != nil {
				return err
			}
		}
	}
	if err := k.EnsureIFB(ifb); err != nil {
		return fmt.Errorf("inbound of uplink %s: %w", uplink, err)
	}
	a.taken[ifb] = true
	return nil
}

// redirectIngress puts the redirect of uplink's ingress to ifb in place
// (read, compare, replace); it reports whether it wrote.
func (a *Agent) redirectIngress(ifb, uplink string) (bool, error) {
	k, err := a.ingressKernel()
	if err != nil {
		return false, err
	}
	cur, ok, err := k.IngressRedirect(uplink)
	if err != nil {
		return false, fmt.Errorf("ingress filters of %s: %w", uplink, err)
	}
	if ok && cur == ifb {
		return false, nil
	}
	if err := k.SetIngressRedirect(uplink, ifb); err != nil {
		return false, err
	}
	return true, nil
}

// releaseIngress gives back what sluice took to shape uplink's inbound
// traffic on ifb: the redirect (and the clsact qdisc when nothing else is
// on it) and the IFB, and forgets it in the record.
func (a *Agent) releaseIngress(ifb, uplink string) error {
	k, err := a.ingressKernel()
	if err != nil {
		return err
	}
	if _, err := removeIngress(k, ifb, uplink); err != nil {
		return err
	}
	delete(a.rec.Ingress, ifb)
	return nil
}

// removeIngress removes the redirect of uplink's ingress to ifb (not one
// to another device: someone else's since) and the IFB; it reports
// whether either was there.
func removeIngress(k IngressKernel, ifb, uplink string) (bool, error) {
	cur, ok, err := k.IngressRedirect(uplink)
	did := err == nil && ok && cur == ifb
	if did || err != nil || !ok {
		if err := k.ClearIngressRedirect(uplink); err != nil {
			return did, fmt.Errorf("ClearIngressRedirect %s: %w", uplink, err)
		}
	}
	gone, err := k.DeleteIFB(ifb)
	if err != nil {
		return did, fmt.Errorf("DeleteIFB %s: %w", ifb, err)
	}
	return did || gone, nil
}

// uninstallIngress removes the inbound shaping of rec (IFBs and the
// redirects to them) and of the uplinks given when rec does not name them
// (a lost state file: a redirect to an IFB of sluice's name is sluice's);
// one line per uplink it cleaned.
func uninstallIngress(k Kernel, rec *Record, uplinks []string) ([]string, error) {
	ik, ok := k.(IngressKernel)
	if !ok {
		return nil, nil
	}
	pairs := map[string]string{} // uplink → ifb
	if rec != nil {
		for ifb, up := range rec.Ingress {
			pairs[up] = ifb
		}
	}
	for _, up := range uplinks {
		if _, known := pairs[up]; known {
			continue
		}
		if cur, ok, err := ik.IngressRedirect(up); err == nil && ok && cur == IFBName(up) {
			pairs[up] = cur
		}
	}
	var done []string
	var errs []error
	for _, up := range slices.Sorted(maps.Keys(pairs)) {
		ifb := pairs[up]
		did, err := removeIngress(ik, ifb, up)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !did {
			continue
		}
		done = append(done, fmt.Sprintf("%s: ingress redirect to %s and the IFB removed", up, ifb))
	}
	return done, errors.Join(errs...)
}

// linkIfAny returns the device dev, nil when it does not exist.
func (k *NetlinkKernel) linkIfAny(dev string) (netlink.Link, error) {
	l, err := k.h.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("LinkByName %s: %w", dev, err)
	}
	return l, nil
}
