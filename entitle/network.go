// Package entitle builds alloc trees from a policy and reads entitlements
// back: the bridge between the policy model and the alloc engine. The CLI
// (`sluice alloc`, `sluice explain`), the agent, the simulator and
// placement use it, so that all of them divide an uplink or a datastore the
// same way (DESIGN.md §2).
//
// entitle computes; it does not load files, read clocks or touch the
// kernel. Rates are float64 bits/s (network) or IOPS (storage).
package entitle

import (
	"fmt"
	"math"
	"strings"

	"sluice/alloc"
	"sluice/policy"
)

// Kinds of network ports.
const (
	KindVNIC  = "vnic"  // a VM's virtual NIC, named VM/NIC
	KindClass = "class" // a system traffic class on a host uplink, named HOST/CLASS
)

// Net is the network entitlement of a cluster: one tree per host uplink.
type Net struct {
	Uplinks []*UplinkTree
	// Ports lists every port of every uplink in tree order: per host and
	// uplink (file order), each class (TrafficClassNames order) followed,
	// for the vm class, by its vNICs (file order).
	Ports []*Port

	byName map[string][]*Port
	solver alloc.Solver
}

// UplinkTree is the scheduling tree of one host uplink: uplink → traffic
// class → vNIC (DESIGN.md §2). System classes other than vm are leaves.
type UplinkTree struct {
	Host, Uplink string
	CapacityBps  float64 // the uplink's usable rate: what alloc divides
	Root         *alloc.Node
	Spec         *UplinkSpec // what the tree was built from
}

// Port is one consumer on an uplink: a vNIC or a traffic class. Its
// settings and entitlement are read from Node after each computation.
type Port struct {
	Host, Uplink string
	Name         string // VM/NIC or HOST/CLASS
	Kind         string // KindVNIC or KindClass
	Class        string // the traffic class: "vm" for vNICs
	Node         *alloc.Node
	Tree         *UplinkTree
	// Declared says the class is named in the policy file (always true
	// for vNICs).
	Declared bool
	// DemandGiven says the demand was set by the caller rather than
	// defaulted.
	DemandGiven bool
	// Unnamed says the port is a vNIC of a running VM that the policy
	// does not name: its settings are the policy's unnamedVMs.
	Unnamed bool
}

// Listed says the port belongs in a listing such as `sluice alloc`: every
// vNIC, and every class that the file declares, that has vNICs, or whose
// demand was given. The other classes carry no traffic.
func (p *Port) Listed() bool {
	return p.Kind == KindVNIC || p.Declared || p.DemandGiven || len(p.Node.Children) > 0
}

// ReservationBps is the port's reservation in bits/s (for the vm class
// without one in the file: the sum of its vNICs' reservations).
func (p *Port) ReservationBps() float64 { return p.Node.Reservation }

// LimitBps is the port's limit in bits/s, alloc.Inf when unlimited.
func (p *Port) LimitBps() float64 { return p.Node.Limit }

// DemandBps is the demand the computation used in bits/s (for the vm class:
// the sum of its vNICs' demands, capped by its limit), alloc.Inf when
// unbounded.
func (p *Port) DemandBps() float64 { return p.Node.EffDemand }

// AllocBps is the port's entitlement in bits/s.
func (p *Port) AllocBps() float64 { return p.Node.Alloc }

// Network builds the uplink trees of every host of p (Derive with every VM
// on its policy host and every uplink up) and computes every port's
// entitlement. demandBps gives demands by port name: "VM/NIC" for a
// vNIC, "HOST/CLASS" for a class on every uplink of the host, or
// "HOST/UPLINK/CLASS" for one uplink; alloc.Inf means unbounded. Ports not
// named get the defaults of DESIGN.md §2 (see NewNet). A name that is no
// port is an error that names it. VMs without a host are on no uplink (a
// demand for their vNICs is accepted and ignored); passthrough vNICs
// bypass the scheduler and are on no uplink either.
func Network(p *policy.Policy, demandBps map[string]float64) (*Net, error) {
	return NetworkWith(p, nil, demandBps)
}

// NetworkWith is Network with the running VMs that the policy does not
// name (Live.Unnamed): their vNICs are ports too, with the policy's
// unnamedVMs setting.
func NetworkWith(p *policy.Policy, unnamed []UnnamedVM, demandBps map[string]float64) (*Net, error) {
	return computed(NewNet(Derive(p, Live{Unnamed: unnamed})), p, demandBps)
}

// computed is n with the demands set and every entitlement computed.
func computed(n *Net, p *policy.Policy, demandBps map[string]float64) (*Net, error) {
	if err := n.SetDemands(p, demandBps); err != nil {
		return nil, err
	}
	n.Compute()
	return n, nil
}

// NewNet builds the alloc trees of the uplinks of d with the default
// demands of DESIGN.md §2: unbounded for every vNIC and every class the
// file declares, 0 for the classes it does not; the vm class's demand is
// the sum of its vNICs' (0 without any). Call SetDemand and Compute.
func NewNet(d *Desired) *Net { return newNet(d.Uplinks) }

func newNet(trees []UplinkSpec) *Net {
	n := &Net{byName: map[string][]*Port{}}
	for i := range trees {
		n.addUplink(&trees[i])
	}
	return n
}

// NewInboundNet is NewNet for the inbound trees of d: what each uplink
// receives towards the vNICs with an ingress setting, divided by the
// same rule (unbounded demand for those vNICs and for the classes with
// an ingress setting).
func NewInboundNet(d *Desired) *Net { return newNet(d.Inbound) }

// Inbound is NetworkWith for what the uplinks receive (NewInboundNet).
// demandBps names ports as NetworkWith does; a name that is no inbound
// port is an error.
func Inbound(p *policy.Policy, unnamed []UnnamedVM, demandBps map[string]float64) (*Net, error) {
	return computed(NewInboundNet(Derive(p, Live{Unnamed: unnamed})), p, demandBps)
}

// Direction is "inbound" for a port of an inbound tree, else "outbound".
func (p *Port) Direction() string {
	if p.Tree.Spec.Inbound {
		return "inbound"
	}
	return "outbound"
}

func (n *Net) addUplink(u *UplinkSpec) {
	t := &UplinkTree{
		Host: u.Host, Uplink: u.Uplink, CapacityBps: u.UsableBps, Spec: u,
		Root: &alloc.Node{Name: u.Host + "/" + u.Uplink, Limit: alloc.Inf, Demand: alloc.Inf, Semantics: alloc.Additive},
	}
	n.Uplinks = append(n.Uplinks, t)
	for _, c := range u.Classes {
		cn := &alloc.Node{Name: c.Name, Reservation: c.ReservationBps, Shares: c.Shares, Limit: c.LimitBps, Semantics: alloc.Additive}
		if c.Declared {
			cn.Demand = alloc.Inf
		}
		t.Root.Children = append(t.Root.Children, cn)
		n.add(&Port{Host: u.Host, Uplink: u.Uplink, Name: c.Name, Kind: KindClass, Class: c.Class, Node: cn, Tree: t, Declared: c.Declared})
		for _, v := range c.VNICs {
			vn := &alloc.Node{Name: v.Port, Reservation: v.ReservationBps, Shares: v.Shares, Limit: v.LimitBps, Demand: alloc.Inf}
			cn.Children = append(cn.Children, vn)
			n.add(&Port{Host: u.Host, Uplink: u.Uplink, Name: v.Port, Kind: KindVNIC, Class: c.Class, Node: vn, Tree: t, Declared: true, Unnamed: v.Unnamed})
		}
		if c.Class == "vm" && len(c.VNICs) == 0 {
			cn.Demand = 0 // no vNIC sends through this uplink
		}
	}
}

// Listed returns the ports of n that belong in a listing (Port.Listed),
// in tree order.
func (n *Net) Listed() []*Port {
	var ports []*Port
	for _, pt := range n.Ports {
		if pt.Listed() {
			ports = append(ports, pt)
		}
	}
	return ports
}

// Controlled returns the listed ports of an inbound net (NewInboundNet)
// that carry something: those of a tree with a vNIC with an ingress
// setting, and the classes that have one. None: what the uplinks receive
// is not controlled.
func (n *Net) Controlled() []*Port {
	var ports []*Port
	for _, pt := range n.Listed() {
		if pt.Tree.Spec.HasVNICs() || pt.Declared {
			ports = append(ports, pt)
		}
	}
	return ports
}

func (n *Net) add(pt *Port) {
	n.Ports = append(n.Ports, pt)
	n.byName[pt.Name] = append(n.byName[pt.Name], pt)
	if pt.Kind == KindClass {
		long := pt.Host + "/" + pt.Uplink + "/" + pt.Class
		n.byName[long] = append(n.byName[long], pt)
	}
}

// SetDemands sets the demands of demandBps (bits/s by port name, as
// Network takes them) on n, derived from p: a vNIC of a VM of p without a
// host is accepted and ignored; any other name that is no port of n is an
// error that names it. Call Compute afterwards.
func (n *Net) SetDemands(p *policy.Policy, demandBps map[string]float64) error {
	for name, d := range demandBps {
		if err := n.SetDemand(name, d); err != nil {
			if isUnplacedPort(p, name) {
				continue
			}
			return err
		}
	}
	return nil
}

// isUnplacedPort says name is VM/NIC of a VM without a host.
func isUnplacedPort(p *policy.Policy, name string) bool {
	vmName, nicName, ok := strings.Cut(name, "/")
	if !ok {
		return false
	}
	vm := p.VM(vmName)
	if vm == nil || vm.Host != "" {
		return false
	}
	for _, nic := range vm.NICs {
		if nic.Name == nicName {
			return true
		}
	}
	return false
}

// SetDemand sets the demand of the named port (see Network for names) in
// bits/s; alloc.Inf means unbounded. Call Compute afterwards.
func (n *Net) SetDemand(name string, bps float64) error {
	if math.IsNaN(bps) || bps < 0 {
		return fmt.Errorf("%s: demand must be ≥ 0", name)
	}
	ports := n.byName[name]
	if len(ports) == 0 {
		return fmt.Errorf("%s: no such port (ports are VM/NIC of a placed VM, or HOST/CLASS)", name)
	}
	for _, pt := range ports {
		if pt.Kind == KindClass && pt.Class == "vm" {
			return fmt.Errorf("%s: the vm class's demand is the sum of its vNICs' demands; give the demand of each VM/NIC", name)
		}
		pt.Node.Demand = bps
		pt.DemandGiven = true
	}
	return nil
}

// Compute recomputes every uplink's entitlements; it allocates nothing once
// it has run on the same trees.
func (n *Net) Compute() {
	for _, t := range n.Uplinks {
		n.solver.Compute(t.Root, t.CapacityBps)
	}
}

// Port returns the ports named name: one for a vNIC, one per uplink of the
// host for HOST/CLASS, one for HOST/UPLINK/CLASS; nil if none.
func (n *Net) Port(name string) []*Port { return n.byName[name] }

// Path returns the tree nodes from the port's uplink root down to the port.
func (p *Port) Path() []*alloc.Node { return alloc.Find(p.Tree.Root, p.Node.Name) }
