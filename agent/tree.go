package agent

import (
	"fmt"
	"math"
	"net/netip"

	"sluice/alloc"
	"sluice/lab"
	"sluice/policy"
)

// Class handles of the tree: the root qdisc is 1:, the root class 1:1,
// traffic class i (policy.TrafficClassNames order) 1:(0x10+i), the vNIC with
// lab index k 1:(0x100+k).
const (
	rootQdiscMajor = 1
	rootMinor      = 1
	classMinorBase = 0x10
	nicMinorBase   = 0x100
)

// hostFilterBase is the first u32 filter handle of host-level traffic; class
// i has handles hostFilterBase+8i…+7. vNIC k has handle 1+k (k < 3072).
const hostFilterBase = 0xc00

// DefaultClass is the traffic class that unclassified packets fall into.
const DefaultClass = "management"

// Node is one class of an uplink's tree below the root: a traffic class or
// a vNIC (a port). Rates are bits/s of payload, as the policy states them.
type Node struct {
	Name     string // "VM/NIC" for a vNIC, "HOST/CLASS" for a traffic class
	Class    string // traffic class name (vm for a vNIC)
	ID       Handle
	Parent   Handle
	IsNIC    bool
	Declared bool // a traffic class the policy file names
	Leaf     bool
	R, L     policy.Bps // reservation, limit (policy.Unlimited when none)
	Shares   int
	IP       netip.Addr // source address of a vNIC
	Children []*Node
}

// Tree is the HTB tree of one uplink of a host.
type Tree struct {
	Host      string
	Uplink    string
	Dev       string     // the uplink device in the host namespace
	SpeedBps  policy.Bps // line rate: the HTB root rate
	UsableBps policy.Bps // payload capacity alloc divides
	Classes   []*Node    // traffic classes, TrafficClassNames order
	Nodes     []*Node    // every node, parents before children
	Filters   []Filter
	Default   uint16 // minor of the default class
}

// Build derives the structure of the HTB tree of every uplink of host.
func Build(p *policy.Policy, pl *lab.Plan, host string) ([]*Tree, error) {
	h := p.Host(host)
	hp := pl.Host(host)
	if h == nil || hp == nil {
		return nil, fmt.Errorf("host %q is not in the policy", host)
	}
	var trees []*Tree
	for ui, u := range h.Uplinks {
		usable := u.Usable
		if usable <= 0 {
			usable = u.Speed
		}
		t := &Tree{Host: host, Uplink: u.Name, Dev: hp.Uplinks[ui].Dev, SpeedBps: u.Speed, UsableBps: usable}
		for ci, tc := range p.TrafficClasses {
			ci = classIndex(tc.Name, ci)
			n := &Node{Name: policy.ClassName(host, tc.Name), Class: tc.Name,
				ID: MakeHandle(rootQdiscMajor, uint16(classMinorBase+ci)), Parent: MakeHandle(rootQdiscMajor, rootMinor),
				R: p.ClassReservation(host, u.Name, tc.Name), L: tc.Limit, Shares: tc.Shares, Leaf: true, Declared: tc.Declared}
			if tc.Name == DefaultClass {
				t.Default = n.ID.Minor()
			}
			t.Classes = append(t.Classes, n)
			t.Nodes = append(t.Nodes, n)
		}
		if t.Default == 0 && len(t.Classes) > 0 {
			t.Default = t.Classes[0].ID.Minor()
		}
		var vmClass *Node
		for _, c := range t.Classes {
			if c.Class == "vm" {
				vmClass = c
			}
		}
		for _, port := range p.NICsOnUplink(host, u.Name) {
			np := pl.NIC(port)
			vm, nic := splitPort(p, port)
			if np == nil || nic == nil || vmClass == nil || vm == nil {
				continue
			}
			if nic.Passthrough {
				continue // bypasses the scheduler
			}
			if 1+np.GlobalIdx >= hostFilterBase {
				return nil, fmt.Errorf("vNIC %s: at most %d vNICs per lab", port, hostFilterBase-1)
			}
			n := &Node{Name: port, Class: "vm", ID: MakeHandle(rootQdiscMajor, uint16(nicMinorBase+np.GlobalIdx)),
				Parent: vmClass.ID, IsNIC: true, Leaf: true, R: nic.Reservation, L: nic.Limit, Shares: nic.Shares, IP: np.IP}
			vmClass.Leaf = false
			vmClass.Children = append(vmClass.Children, n)
			t.Nodes = append(t.Nodes, n)
			// A vNIC's filter handle follows its lab index, so that other
			// vNICs coming and going do not rewrite it.
			t.Filters = append(t.Filters, Filter{Handle: uint32(1 + np.GlobalIdx), ClassID: n.ID, Keys: []U32Key{srcIPKey(np.IP)}})
		}
		for ci, c := range t.Classes {
			fh := uint32(hostFilterBase + 8*ci)
			for _, port := range classPorts[c.Class] {
				t.Filters = append(t.Filters, Filter{Handle: fh, ClassID: c.ID, Keys: []U32Key{srcIPKey(hp.IP), dstPortKey(port)}})
				fh++
			}
			if d, ok := classDSCP[c.Class]; ok {
				t.Filters = append(t.Filters, Filter{Handle: fh, ClassID: c.ID, Keys: []U32Key{srcIPKey(hp.IP), dscpKey(d)}})
			}
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

func splitPort(p *policy.Policy, port string) (*policy.VM, *policy.NIC) {
	for i := range p.VMs {
		vm := &p.VMs[i]
		for j := range vm.NICs {
			if policy.PortName(vm.Name, vm.NICs[j].Name) == port {
				return vm, &vm.NICs[j]
			}
		}
	}
	return nil, nil
}

// minRate is the guaranteed rate of a class that reserves nothing: HTB
// needs a positive rate. 0.01% of the line rate, at least 8 kbit/s.
func (t *Tree) minRate() policy.Bps { return max(t.SpeedBps/10000, 8000) }

// scale converts payload bits/s (what alloc divides) to wire bits/s (what
// HTB counts).
func (t *Tree) scale() float64 { return float64(t.SpeedBps) / float64(t.UsableBps) }

// Frame bytes HTB counts for the most efficient payload: a full TCP segment
// at MTU 1500 carries 1448 bytes under 66 bytes of Ethernet (14), IPv4 (20)
// and TCP with timestamps (32) headers; HTB counts a frame from its Ethernet
// header on (a GSO segment as that many frames).
const fullFrameBytes, fullPayloadBytes = 1514.0, 1448.0

// limitScale converts a payload limit to the wire ceil HTB enforces. A cap
// must hold for the most efficient traffic, so it carries header overhead
// only: scale() also carries what the uplink loses at line rate (the usable
// rate is measured saturated), and a 200 Mbps limit scaled by it let a
// single TCP flow through at 204 Mbps. Smaller packets stay further under.
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
// proportion to shares. With ent (payload bits/s per node name, from alloc)
// each leaf's rate is its entitlement on the wire, and an inner class's rate
// the sum of its children's.
func (t *Tree) HTBClasses(ent map[string]float64) []HTBClass {
	out := []HTBClass{{ID: MakeHandle(rootQdiscMajor, rootMinor), Parent: MakeHandle(rootQdiscMajor, 0),
		RateBps: t.SpeedBps, CeilBps: t.SpeedBps, BurstBytes: BurstFor(t.SpeedBps), CburstBytes: BurstFor(t.SpeedBps),
		QuantumBytes: MinQuantumBytes}}
	quanta := func(sib []*Node) map[Handle]uint32 {
		minS := math.MaxInt
		for _, n := range sib {
			minS = min(minS, max(n.Shares, 1))
		}
		q := map[Handle]uint32{}
		for _, n := range sib {
			v := float64(MinQuantumBytes) * float64(max(n.Shares, 1)) / float64(minS)
			q[n.ID] = uint32(min(v, 64*MinQuantumBytes))
		}
		return q
	}
	rate := func(n *Node) policy.Bps {
		var r policy.Bps
		if ent == nil {
			r = n.R
		} else if n.Leaf {
			r = policy.Bps(ent[n.Name] * t.scale())
		} else {
			for _, c := range n.Children {
				if e := policy.Bps(ent[c.Name] * t.scale()); e > t.minRate() {
					r += e
				} else {
					r += t.minRate()
				}
			}
		}
		return min(max(r, t.minRate()), t.SpeedBps)
	}
	ceil := func(n *Node, parentCeil policy.Bps) policy.Bps {
		c := parentCeil
		if n.L != policy.Unlimited && n.L > 0 {
			wire := n.L
			if ent != nil {
				wire = policy.Bps(float64(n.L) * t.limitScale())
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
		qn := quanta(c.Children)
		for _, n := range c.Children {
			nc := ceil(n, cc)
			nr := min(rate(n), nc)
			out = append(out, HTBClass{ID: n.ID, Parent: n.Parent, RateBps: nr, CeilBps: nc,
				BurstBytes: BurstFor(nr), CburstBytes: BurstFor(nc), QuantumBytes: qn[n.ID]})
		}
	}
	return out
}

// AllocTree builds the alloc input for the uplink: root → classes → vNICs,
// with each leaf's demand from demand (payload bits/s by node name; missing
// means 0). Values are payload bits/s.
func (t *Tree) AllocTree(demand map[string]float64) *alloc.Node {
	lim := func(l policy.Bps) float64 {
		if l == policy.Unlimited || l <= 0 {
			return alloc.Inf
		}
		return float64(l)
	}
	root := &alloc.Node{Name: t.Host + "/" + t.Uplink, Limit: alloc.Inf, Semantics: alloc.Additive}
	for _, c := range t.Classes {
		cn := &alloc.Node{Name: c.Name, Reservation: float64(c.R), Shares: float64(c.Shares), Limit: lim(c.L),
			Demand: demand[c.Name], Semantics: alloc.Additive}
		for _, n := range c.Children {
			cn.Children = append(cn.Children, &alloc.Node{Name: n.Name, Reservation: float64(n.R),
				Shares: float64(n.Shares), Limit: lim(n.L), Demand: demand[n.Name], Semantics: alloc.Additive})
		}
		root.Children = append(root.Children, cn)
	}
	return root
}

// Entitlements runs alloc on the tree with the given demands and returns
// every node's entitlement in payload bits/s, by name.
//
// Leaves whose demand is below the HTB floor (minRate) keep that floor, so
// the capacity divided is the usable rate less their floors: the HTB rates
// then add up to the line rate and nothing is left for HTB to hand out by
// its own rules.
func (t *Tree) Entitlements(demand map[string]float64) map[string]float64 {
	root := t.AllocTree(demand)
	floor := float64(t.minRate()) / t.scale()
	capacity := float64(t.UsableBps)
	for _, n := range t.Nodes {
		if n.Leaf && demand[n.Name] < floor {
			capacity -= floor
		}
	}
	alloc.Compute(root, max(capacity, 0))
	return alloc.Allocs(root)
}
