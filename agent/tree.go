package agent

import (
	"fmt"
	"math"
	"slices"

	"sluice/entitle"
	"sluice/policy"
)

// Class handles of the tree: the root qdisc is 1:, the root class 1:1,
// traffic class i (policy.TrafficClassNames order) 1:(0x10+i), the vNIC with
// inventory index k 1:(0x100+k).
const (
	rootQdiscMajor = 1
	rootMinor      = 1
	classMinorBase = 0x10
	nicMinorBase   = 0x100
)

// hostFilterBase is the first u32 filter handle of host-level traffic;
// class i has handles hostFilterBase+hostFiltersPerClass·i and up (its port
// blocks, then its DSCP). vNICs have no filter: their eBPF classifier at
// the vNIC sets the packet's priority to their class.
const (
	hostFilterBase      = 0xc00
	hostFiltersPerClass = 32
)

// MaxVNICIndex is the largest inventory index a vNIC may have.
const MaxVNICIndex = hostFilterBase - 2

// DefaultClass is the traffic class that unclassified packets fall into.
const DefaultClass = "management"

// Node is one class of an uplink's tree below the root: a traffic class or
// a vNIC (a port). Rates are payload, as the policy states them.
type Node struct {
	Name     string // "VM/NIC" for a vNIC, "HOST/CLASS" for a traffic class
	Class    string // traffic class name (vm for a vNIC)
	ID       Handle
	Parent   Handle
	IsNIC    bool
	HostDev  string // a vNIC's host-side device ("" when the inventory has none)
	Declared bool   // a traffic class the policy file names
	Leaf     bool
	R        PayloadBps // reservation
	L        PayloadBps // limit, +Inf when unlimited
	Shares   float64
	// LatencySensitive marks a vNIC of a latency-sensitive VM: HTB serves
	// it before its siblings (HTBClasses).
	LatencySensitive bool
	Children         []*Node
}

// Tree is the HTB tree of one uplink of a host, built from the derived
// uplink tree (entitle.UplinkSpec) and the host's inventory.
type Tree struct {
	Host   string
	Uplink string
	// Dev is the device the tree is on: the uplink device, or for an
	// inbound tree the uplink's IFB (IFBName of UplinkDev).
	Dev string
	// Inbound says the tree shapes what the uplink receives towards the
	// host's vNICs (entitle.UplinkSpec.Inbound); UplinkDev is then the
	// uplink device whose ingress is redirected to Dev.
	Inbound   bool
	UplinkDev string
	SpeedBps  WireBps    // line rate: the HTB root rate
	UsableBps PayloadBps // payload capacity alloc divides
	Classes   []*Node    // traffic classes, TrafficClassNames order
	Nodes     []*Node    // every node, parents before children
	Filters   []Filter
	Default   uint16 // minor of the default class
	// VNICs are the classifiers at the vNICs of the uplink: each vNIC's
	// host-side device and the class its packets are put in.
	VNICs []VNICClassifier
	// VFs are the SR-IOV VFs whose PF is this uplink, with their rates
	// (entitle.UplinkSpec.VFs): they are on no HTB class.
	VFs []entitle.VFSpec

	net *entitle.Net // alloc trees of the uplink, reused every step
}

// Build derives the HTB tree of every uplink in specs (one host's uplinks
// of entitle.Derive) with the devices and vNIC matches of inv. A vNIC of the
// spec that inv does not know has no class of its own (its packets fall
// into the default class) but keeps its place in the entitlements.
func Build(specs []entitle.UplinkSpec, inv Inventory) ([]*Tree, error) {
	return build(specs, inv, DefaultClassPorts)
}

// VNICClassifier is the classifier of one vNIC: on its host-side device
// Dev, every packet the VM sends gets skb->priority = Class, which HTB on
// the uplink takes as the packet's class.
type VNICClassifier struct {
	Dev   string
	Class Handle
}

func build(specs []entitle.UplinkSpec, inv Inventory, ports map[string][]PortRange) ([]*Tree, error) {
	var trees []*Tree
	for _, u := range specs {
		dev, err := inv.UplinkDevice(u.Uplink)
		if err != nil {
			return nil, fmt.Errorf("uplink %s/%s: %w", u.Host, u.Uplink, err)
		}
		t := &Tree{Host: u.Host, Uplink: u.Uplink, Dev: dev, SpeedBps: WireBps(u.SpeedBps), UsableBps: PayloadBps(u.UsableBps),
			net: entitle.NewNet(&entitle.Desired{Uplinks: []entitle.UplinkSpec{u}}), VFs: u.VFs}
		if u.Inbound {
			t.Inbound, t.UplinkDev, t.Dev = true, dev, IFBName(dev)
		}
		for ci, c := range u.Classes {
			ci = classIndex(c.Class, ci)
			n := &Node{Name: c.Name, Class: c.Class,
				ID: MakeHandle(rootQdiscMajor, uint16(classMinorBase+ci)), Parent: MakeHandle(rootQdiscMajor, rootMinor),
				R: PayloadBps(c.ReservationBps), L: PayloadBps(c.LimitBps), Shares: c.Shares, Leaf: true, Declared: c.Declared}
			if c.Class == DefaultClass {
				t.Default = n.ID.Minor()
			}
			t.Classes = append(t.Classes, n)
			t.Nodes = append(t.Nodes, n)
			for _, v := range c.VNICs {
				m, ok := inv.VNIC(v.Port)
				if !ok {
					continue
				}
				if m.Index < 0 || m.Index > MaxVNICIndex {
					return nil, fmt.Errorf("vNIC %s: inventory index %d out of range 0..%d", v.Port, m.Index, MaxVNICIndex)
				}
				vn := &Node{Name: v.Port, Class: c.Class, ID: MakeHandle(rootQdiscMajor, uint16(nicMinorBase+m.Index)),
					Parent: n.ID, IsNIC: true, HostDev: m.HostDev, Leaf: true, R: PayloadBps(v.ReservationBps), L: PayloadBps(v.LimitBps), Shares: v.Shares,
					LatencySensitive: v.LatencySensitive}
				n.Leaf = false
				n.Children = append(n.Children, vn)
				t.Nodes = append(t.Nodes, vn)
				if t.Inbound {
					// Inbound, a vNIC's packets are those addressed to it:
					// to its MAC where known, else to its IPv4 address.
					switch {
					case len(m.MAC) == 6:
						t.Filters = append(t.Filters, Filter{Handle: inboundFilterHandle(m.Index), ClassID: vn.ID, Keys: dstMACKeys(m.MAC)})
					case m.SrcIP.Is4():
						t.Filters = append(t.Filters, Filter{Handle: inboundFilterHandle(m.Index), ClassID: vn.ID, Keys: []U32Key{dstIPKey(m.SrcIP)}})
					}
				} else if m.HostDev != "" {
					t.VNICs = append(t.VNICs, VNICClassifier{Dev: m.HostDev, Class: vn.ID})
				}
			}
		}
		if t.Default == 0 && len(t.Classes) > 0 {
			t.Default = t.Classes[0].ID.Minor()
		}
		if a := inv.HostAddr(); a.IsValid() {
			// Outbound, host traffic is what the host's address sends to
			// a class's ports; inbound (the mirror), what is sent to the
			// host's address, to a class's ports (a peer migrating a VM
			// here) or from them (an NFS server's replies).
			host := srcIPKey(a)
			if t.Inbound {
				host = dstIPKey(a)
			}
			for _, c := range t.Classes {
				ci := int(c.ID.Minor()) - classMinorBase
				var fs []Filter
				for _, r := range ports[c.Class] {
					if r.First > r.Last {
						return nil, fmt.Errorf("class %s: port range %d-%d is empty", c.Class, r.First, r.Last)
					}
					for _, k := range dstPortKeys(r) {
						fs = append(fs, Filter{ClassID: c.ID, Keys: []U32Key{host, k}})
					}
					if t.Inbound {
						for _, k := range dstPortKeys(r) {
							fs = append(fs, Filter{ClassID: c.ID, Keys: []U32Key{host, srcPortKey(k)}})
						}
					}
				}
				if d, ok := classDSCP[c.Class]; ok {
					fs = append(fs, Filter{ClassID: c.ID, Keys: []U32Key{host, dscpKey(d)}})
				}
				if len(fs) > hostFiltersPerClass {
					return nil, fmt.Errorf("class %s: its ports need %d u32 filters, at most %d", c.Class, len(fs), hostFiltersPerClass)
				}
				for j := range fs {
					fs[j].Handle = uint32(hostFilterBase + hostFiltersPerClass*ci + j)
				}
				t.Filters = append(t.Filters, fs...)
			}
		}
		if t.Inbound {
			anyEtherType(t.Filters)
		}
		trees = append(trees, t)
	}
	return trees, nil
}

func classIndex(name string, fallback int) int {
	for i, n := range policy.TrafficClassNames {
		if n == name {
			return i
		}
	}
	return fallback
}

// minRate is the guaranteed rate of a class that reserves nothing: HTB
// needs a positive rate. 0.01% of the line rate, at least 8 kbit/s.
func (t *Tree) minRate() WireBps { return max(t.SpeedBps/10000, 8000) }

// scale is wire bits per payload bit at the usable rate: line rate over
// usable rate.
func (t *Tree) scale() float64 { return float64(t.SpeedBps) / float64(t.UsableBps) }

// Wire converts a payload rate (what alloc divides) to the wire rate HTB
// counts, at the uplink's measured efficiency.
func (t *Tree) Wire(p PayloadBps) float64 { return float64(p) * t.scale() }

// Payload converts a wire rate to payload at the uplink's measured
// efficiency.
func (t *Tree) Payload(w float64) PayloadBps { return PayloadBps(w / t.scale()) }

// Frame bytes HTB counts for the most efficient payload: a full TCP segment
// at MTU 1500 carries 1448 bytes under 66 bytes of Ethernet (14), IPv4 (20)
// and TCP with timestamps (32) headers; HTB counts a frame from its Ethernet
// header on (a GSO segment as that many frames).
const fullFrameBytes, fullPayloadBytes = 1514.0, 1448.0

// limitScale converts a payload limit to the wire ceil HTB enforces. A cap
// must hold for the most efficient traffic, so it carries header overhead
// only, never the uplink's other losses that scale() includes. Smaller
// packets stay further under the cap.
func (t *Tree) limitScale() float64 { return min(t.scale(), fullFrameBytes/fullPayloadBytes) }

// MaxPayloadBps is the most TCP payload an uplink of line rate speed can
// carry through HTB: full segments only (956.4 Mbps at 1 Gbps). A measured
// usable rate is at most this.
func MaxPayloadBps(speed policy.Bps) float64 {
	return float64(speed) * fullPayloadBytes / fullFrameBytes
}

// HTBClasses renders the tree as HTB classes, parents first. With ent nil the
// tree is static: each class's rate is its reservation (at least minRate),
// its ceil its limit (at most the line rate), and excess goes by quantum in
// proportion to shares. With ent (payload entitlements by node name) the
// tree is dynamic: see leafRates; an inner class's rate is the sum of its
// children's.
func (t *Tree) HTBClasses(ent map[string]float64) []HTBClass {
	out := []HTBClass{{ID: MakeHandle(rootQdiscMajor, rootMinor), Parent: MakeHandle(rootQdiscMajor, 0),
		RateBps: t.SpeedBps, CeilBps: t.SpeedBps, BurstBytes: BurstFor(t.SpeedBps), CburstBytes: BurstFor(t.SpeedBps),
		QuantumBytes: MinQuantumBytes}}
	quanta := func(sib []*Node) map[Handle]uint32 {
		minS := math.Inf(1)
		for _, n := range sib {
			minS = min(minS, max(n.Shares, 1))
		}
		q := map[Handle]uint32{}
		for _, n := range sib {
			v := float64(MinQuantumBytes) * max(n.Shares, 1) / minS
			q[n.ID] = uint32(min(v, 64*MinQuantumBytes))
		}
		return q
	}
	var leaf map[string]WireBps
	if ent != nil {
		leaf = t.leafRates(ent)
	}
	rate := func(n *Node) WireBps {
		var r WireBps
		switch {
		case ent == nil:
			r = WireBps(n.R)
		case n.Leaf:
			r = leaf[n.Name]
		default:
			for _, c := range n.Children {
				r += leaf[c.Name]
			}
		}
		return min(max(r, t.minRate()), t.SpeedBps)
	}
	ceil := func(n *Node, parentCeil WireBps) WireBps {
		c := parentCeil
		if !math.IsInf(float64(n.L), 1) {
			wire := WireBps(n.L)
			if ent != nil {
				wire = WireBps(float64(n.L) * t.limitScale())
			}
			c = min(c, wire)
		}
		return c
	}
	qc := quanta(t.Classes)
	for _, c := range t.Classes {
		cc := ceil(c, t.SpeedBps)
		r := min(rate(c), cc)
		out = append(out, HTBClass{ID: c.ID, Parent: c.Parent, RateBps: r, CeilBps: cc,
			BurstBytes: BurstFor(r), CburstBytes: BurstFor(cc), QuantumBytes: qc[c.ID]})
		qn, pn := quanta(c.Children), prios(c.Children)
		for _, n := range c.Children {
			nc := ceil(n, cc)
			nr := min(rate(n), nc)
			out = append(out, HTBClass{ID: n.ID, Parent: n.Parent, RateBps: nr, CeilBps: nc,
				BurstBytes: BurstFor(nr), CburstBytes: BurstFor(nc), QuantumBytes: qn[n.ID], Prio: pn[n.ID]})
		}
	}
	return out
}

// prios are the HTB priorities of sibs: 0 for the vNICs of
// latency-sensitive VMs and 1 for the others, so that HTB serves the
// former first while they can send (within their rate or borrowing);
// all 0, HTB's default, when none is latency-sensitive.
func prios(sibs []*Node) map[Handle]uint32 {
	out := map[Handle]uint32{}
	if !slices.ContainsFunc(sibs, func(n *Node) bool { return n.LatencySensitive }) {
		return out
	}
	for _, n := range sibs {
		if !n.LatencySensitive {
			out[n.ID] = 1
		}
	}
	return out
}

// leafRates turns payload entitlements into the leaves' guaranteed wire
// rates. HTB needs a positive rate, so a leaf entitled to less than
// minRate gets minRate; what those floors add is taken from the other
// leaves in proportion to their rates, so that the guaranteed rates add up
// to at most the line rate and HTB has nothing to hand out by rules of its
// own.
func (t *Tree) leafRates(ent map[string]float64) map[string]WireBps {
	out := map[string]WireBps{}
	floor := float64(t.minRate())
	var floors, big float64
	for _, n := range t.Nodes {
		if !n.Leaf {
			continue
		}
		if w := t.Wire(PayloadBps(ent[n.Name])); w < floor {
			floors += floor
		} else {
			big += w
		}
	}
	k := 1.0
	if big > 0 && big+floors > float64(t.SpeedBps) {
		k = max(float64(t.SpeedBps)-floors, 0) / big
	}
	for _, n := range t.Nodes {
		if !n.Leaf {
			continue
		}
		w := t.Wire(PayloadBps(ent[n.Name]))
		if w < floor {
			out[n.Name] = WireBps(floor)
		} else {
			out[n.Name] = WireBps(w * k)
		}
	}
	return out
}

// Entitlements computes every node's entitlement in payload bits/s, by
// name, with the derivation's alloc tree (entitle.NewNet) and the given
// demands (payload bits/s by node name; missing means 0; the vm class's
// demand is its vNICs'). It is exactly what `sluice alloc` computes for the
// same demands.
func (t *Tree) Entitlements(demand map[string]float64) map[string]float64 {
	for _, pt := range t.net.Ports {
		if pt.Kind == entitle.KindClass && pt.Class == "vm" {
			continue
		}
		pt.Node.Demand = demand[pt.Name]
	}
	t.net.Compute()
	out := make(map[string]float64, len(t.net.Ports))
	for _, pt := range t.net.Ports {
		out[pt.Name] = pt.AllocBps()
	}
	return out
}
