// Package agent is the network side of the sluice host agent: it derives the
// HTB tree of every uplink of one host from the policy (root at the line
// rate, a class per traffic class, a leaf per vNIC, u32 filters that put each
// vNIC's packets and host-level traffic into their classes), reconciles it
// into the kernel through netlink (read, compare, replace: applying twice
// changes nothing), and, when dynamic enforcement is on, sets every class's
// guaranteed rate from the entitlements alloc computes on measured demand.
//
// Kernel calls sit behind the Kernel interface; FakeKernel renders its state
// as text for tests. The control step (Agent.Step) takes the time as an
// argument and never sleeps; only Run reads a clock.
package agent

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// Handle is a tc handle major:minor packed as the kernel does (major<<16|minor).
type Handle uint32

// MakeHandle packs major:minor.
func MakeHandle(major, minor uint16) Handle { return Handle(uint32(major)<<16 | uint32(minor)) }

// Minor returns the minor part.
func (h Handle) Minor() uint16 { return uint16(h) }

func (h Handle) String() string { return fmt.Sprintf("%x:%x", uint32(h)>>16, uint16(h)) }

// ParseHandle reads a handle as String writes it ("1:100").
func ParseHandle(s string) (Handle, error) {
	var major, minor uint16
	if _, err := fmt.Sscanf(s, "%x:%x", &major, &minor); err != nil {
		return 0, fmt.Errorf("handle %q: %w", s, err)
	}
	return MakeHandle(major, minor), nil
}

// WireBps is a rate on the wire in bits/s: L2 frames from the Ethernet
// header on, as HTB counts them.
type WireBps int64

// PayloadBps is a rate of payload in bits/s: what the policy states and
// alloc divides. Tree.Wire and Tree.Payload convert.
type PayloadBps float64

// HTBClass is one HTB class as sluice sets it. Rates are on the wire; the
// netlink wrapper converts to the kernel's bytes/s.
type HTBClass struct {
	ID           Handle
	Parent       Handle
	RateBps      WireBps // guaranteed rate
	CeilBps      WireBps // maximum rate, borrowing included
	BurstBytes   uint32  // bucket of the rate
	CburstBytes  uint32  // bucket of the ceil
	QuantumBytes uint32  // DRR quantum when borrowing; ≥ MinQuantumBytes
	Prio         uint32
}

// ClassCounters are the counters of one class as read from the kernel.
type ClassCounters struct {
	Bytes   uint64
	Packets uint64
	Drops   uint64
	Queued  uint64 // packets waiting in the class's queue when it was read
}

// ClassState is an HTBClass read back with its counters.
type ClassState struct {
	HTBClass
	ClassCounters
}

// Filter is a u32 filter at the root qdisc that sends matching packets to
// a class. Handle identifies it (u32 node 800::N). It sees IPv4 packets
// only (protocol ip), or with AnyEtherType frames of every EtherType
// (protocol all: IPv4, IPv6, ARP); the filters of one device all have the
// same, as the kernel keeps one protocol per priority.
type Filter struct {
	Handle       uint32
	ClassID      Handle
	Keys         []U32Key
	AnyEtherType bool
}

// U32Key matches the 32-bit word at byte offset Off of the network header
// (negative: the Ethernet header before it): (word & Mask) == Val, both in
// host order.
type U32Key struct {
	Mask, Val uint32
	Off       int32
}

// Kernel is the small interface through which the agent reads and writes
// traffic control state of a device (an uplink in the host namespace).
type Kernel interface {
	// RootHTB reports whether dev's root qdisc is HTB with handle 1: and
	// the given default class minor.
	RootHTB(dev string) (ok bool, defaultMinor uint16, err error)
	// ReplaceRootHTB installs an HTB root qdisc 1: (dropping any classes).
	ReplaceRootHTB(dev string, defaultMinor uint16) error
	Classes(dev string) ([]ClassState, error)
	// ClassTokens returns each HTB class's token balance in ns of its own
	// rate; negative: it sent beyond its rate and is in debt that long
	// (HTB serves it only by borrowing until real time has paid the debt).
	ClassTokens(dev string) (map[Handle]int64, error)
	ReplaceClass(dev string, c HTBClass) error
	DeleteClass(dev string, id Handle) error
	Filters(dev string) ([]Filter, error)
	ReplaceFilter(dev string, f Filter) error
	DeleteFilter(dev string, handle uint32) error

	// RootQdisc reports dev's root qdisc as the kernel has it: what the
	// agent records before it replaces it (uninstall gives it back).
	RootQdisc(dev string) (Qdisc, error)
	// RestoreRoot puts q back as dev's root qdisc in place of sluice's
	// HTB: a kernel default (q.Default) by deleting the root, so that the
	// kernel attaches its default again; any other by replacing the root
	// with q's kind and options.
	RestoreRoot(dev string, q Qdisc) error
	// MasterKind returns the kind of the device dev is enslaved to
	// ("bridge", "bond", "openvswitch", …), "" when it has none.
	MasterKind(dev string) (string, error)

	// VNICClass reports the class sluice's classifier on the clsact
	// ingress of dev (a vNIC's host-side device) puts the vNIC's packets
	// in; ok is false when dev has no sluice classifier (or one whose
	// program is not sluice's current one).
	VNICClass(dev string) (class Handle, ok bool, err error)
	// SetVNICClass attaches (or replaces) on dev's clsact ingress, adding
	// clsact when missing, the eBPF program that sets every packet's
	// skb->priority to class (VNICProgram), so that HTB on the uplink
	// classifies it there.
	SetVNICClass(dev string, class Handle) error
	// ClearVNICClass removes sluice's classifier from dev, and dev's
	// clsact qdisc when no other filter is left on it. A device that is
	// gone or has no classifier is not an error.
	ClearVNICClass(dev string) error
}

// Qdisc is a root qdisc as netlink reports it: its kind, handle and
// options (netlink's struct of that kind as JSON). Default marks a root the
// kernel attached by itself (handle 0:, e.g. noqueue on a veth, mq on a
// multi-queue NIC, pfifo_fast or fq_codel on a single-queue one): it is
// given back by deleting whatever replaced it.
type Qdisc struct {
	Kind    string `json:"kind"`
	Handle  string `json:"handle"`
	Default bool   `json:"default"`
	// Options are netlink's struct of the kind as JSON: what an older
	// sluice recorded (it lost parameters netlink does not know).
	Options json.RawMessage `json:"options,omitempty"`
	// Raw marks a root recorded as the kernel dumped it: TCAOptions is
	// the payload of its TCA_OPTIONS (empty for kinds without options),
	// which RestoreRoot sends back unchanged, every parameter kept.
	Raw        bool   `json:"raw,omitempty"`
	TCAOptions []byte `json:"tca_options,omitempty"`
	// Device names the device in the kernel (network namespace inode,
	// ifindex and name); "" when unknown. The agent's roots record
	// (DefaultRootsDir) is keyed by it.
	Device string `json:"device,omitempty"`
	// Unrestorable says why sluice could not give this root back (qdiscs,
	// classes or filters below it; a size table); "" when it could.
	Unrestorable string `json:"unrestorable,omitempty"`
}

// IsSluice tells whether q is the root sluice installs: HTB with handle 1:.
func (q Qdisc) IsSluice() bool {
	return q.Kind == "htb" && q.Handle == MakeHandle(rootQdiscMajor, 0).String()
}

// MinQuantumBytes is the smallest HTB quantum sluice sets: one full GSO
// segment (64 KiB) plus headers, so that a class with the fewest shares can
// still send a whole segment per round.
const MinQuantumBytes = 65536 + 1514

// MinBurstBytes is the smallest bucket: two GSO segments, or HTB
// under-delivers with segmentation offload.
const MinBurstBytes = 2 * (65536 + 1514)

// BurstFor sizes a bucket to a rate: what the rate sends in 2 ms, at least
// MinBurstBytes.
func BurstFor(rate WireBps) uint32 {
	b := float64(rate) / 8 * 0.002
	if b < MinBurstBytes {
		return MinBurstBytes
	}
	if b > 1<<30 {
		return 1 << 30
	}
	return uint32(b)
}

// PortRange is a range of TCP/UDP destination ports, First..Last
// inclusive (First == Last for one port).
type PortRange struct{ First, Last uint16 }

// DefaultClassPorts are the destination ports of host-level traffic
// classes on a KVM/libvirt host: a packet from the host's own address goes
// to the class when its destination port (TCP or UDP) is in one of the
// class's ranges, or its DSCP is the class's. vmotion is libvirt/QEMU live
// migration (49152–49215), vsan stands for Ceph (monitors 3300 and 6789,
// OSDs 6800–7300); replication, ft and backup keep vSphere's ports, which
// have no KVM standard. Config.ClassPorts replaces them.
var DefaultClassPorts = map[string][]PortRange{
	"nfs":         {{2049, 2049}},
	"vmotion":     {{49152, 49215}},
	"iscsi":       {{3260, 3260}},
	"vsan":        {{3300, 3300}, {6789, 6789}, {6800, 7300}},
	"replication": {{31031, 31031}, {44046, 44046}},
	"ft":          {{8100, 8100}, {8200, 8200}},
	"backup":      {{902, 902}},
}

var classDSCP = map[string]uint8{
	"nfs": 18, "vsan": 20, "iscsi": 22, "vmotion": 26, "replication": 28, "ft": 34, "backup": 10,
}

// srcIPKey matches an IPv4 source address.
func srcIPKey(a netip.Addr) U32Key {
	b := a.As4()
	return U32Key{Mask: 0xffffffff, Val: uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]), Off: 12}
}

// dstPortKeys matches the TCP/UDP destination ports of r (assumes no IP
// options). u32 compares a masked word, so a range is cut into aligned
// blocks of a power of two ports, one key (one filter) each: 49152–49215
// is one block, Ceph's 6800–7300 seven.
func dstPortKeys(r PortRange) []U32Key {
	var out []U32Key
	for lo := uint32(r.First); lo <= uint32(r.Last); {
		size := uint32(1)
		for lo%(size*2) == 0 && lo+size*2-1 <= uint32(r.Last) && size < 1<<16 {
			size *= 2
		}
		out = append(out, U32Key{Mask: 0x0000ffff &^ (size - 1), Val: lo, Off: 20})
		lo += size
	}
	return out
}

// dscpKey matches the DSCP field of the TOS byte.
func dscpKey(dscp uint8) U32Key {
	return U32Key{Mask: 0x00fc0000, Val: uint32(dscp) << 18, Off: 0}
}
