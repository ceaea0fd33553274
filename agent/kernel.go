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

// Filter is a u32 filter at the root qdisc that sends matching IPv4 packets
// to a class. Handle identifies it (u32 node 800::N).
type Filter struct {
	Handle  uint32
	ClassID Handle
	Keys    []U32Key
}

// U32Key matches the 32-bit word at byte offset Off of the IPv4 header:
// (word & Mask) == Val, both in host order.
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
	ReplaceClass(dev string, c HTBClass) error
	DeleteClass(dev string, id Handle) error
	Filters(dev string) ([]Filter, error)
	ReplaceFilter(dev string, f Filter) error
	DeleteFilter(dev string, handle uint32) error
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

// Well-known ports and DSCP values of host-level traffic classes: a packet
// from the host's own address goes to the class when its destination port
// (TCP or UDP) or its DSCP matches.
var classPorts = map[string][]uint16{
	"nfs":         {2049},
	"vmotion":     {8000},
	"iscsi":       {3260},
	"vsan":        {2233},
	"replication": {31031, 44046},
	"ft":          {8100, 8200},
	"backup":      {902},
}

var classDSCP = map[string]uint8{
	"nfs": 18, "vsan": 20, "iscsi": 22, "vmotion": 26, "replication": 28, "ft": 34, "backup": 10,
}

// srcIPKey matches an IPv4 source address.
func srcIPKey(a netip.Addr) U32Key {
	b := a.As4()
	return U32Key{Mask: 0xffffffff, Val: uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]), Off: 12}
}

// dstPortKey matches a TCP/UDP destination port (assumes no IP options).
func dstPortKey(port uint16) U32Key { return U32Key{Mask: 0x0000ffff, Val: uint32(port), Off: 20} }

// dscpKey matches the DSCP field of the TOS byte.
func dscpKey(dscp uint8) U32Key {
	return U32Key{Mask: 0x00fc0000, Val: uint32(dscp) << 18, Off: 0}
}
