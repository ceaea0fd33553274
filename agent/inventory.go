package agent

import (
	"fmt"
	"net"
	"net/netip"
)

// Inventory tells the agent what runs on its host and how to find it: the
// device of each uplink, which VMs run here, and how each vNIC's packets
// are recognised. The lab's namespaces are one implementation
// (lab.Plan.Inventory); a hypervisor's (libvirt) is another.
type Inventory interface {
	// VMs returns the names of the VMs that run on the host now.
	VMs() ([]string, error)
	// UplinkDevice returns the device that carries the egress of the
	// host's uplink (the policy's uplink name).
	UplinkDevice(uplink string) (string, error)
	// VNIC returns how the packets of the vNIC port (VM/NIC) are
	// recognised (its host-side device); ok is false when the host has no
	// such vNIC.
	VNIC(port string) (m VNICMatch, ok bool)
	// HostAddr returns the host's own source address, which the system
	// traffic classes match (with their ports and DSCP values); the zero
	// Addr when host traffic is not classified.
	HostAddr() netip.Addr
}

// VNICMatch is how the agent recognises a vNIC's packets.
type VNICMatch struct {
	// Index is stable for the vNIC while it runs (0..MaxVNICIndex): its
	// class and filter handles follow it, so that other vNICs coming and
	// going do not rewrite them.
	Index int
	// HostDev is the vNIC's host-side device in the host's namespace (a
	// tap such as vnet3, the host end of a lab veth): the agent classifies
	// the vNIC's packets there, whatever their protocol (VNICClassifier).
	// Empty: the vNIC has no classifier and its packets fall into the
	// default class.
	HostDev string
	// SrcIP is the vNIC's IPv4 address where known. Outbound
	// classification does not use it; inbound, a vNIC without MAC gets
	// the packets addressed to it.
	SrcIP netip.Addr
	// MAC is the guest's MAC address on the vNIC, where known: inbound,
	// the vNIC gets the IPv4 frames addressed to it (the agent's u32
	// filters are of protocol ip).
	MAC net.HardwareAddr
}

// StaticInventory is an inventory written down once: the lab's namespace
// VMs, and tests.
type StaticInventory struct {
	Running []string             // VMs on the host
	Devices map[string]string    // uplink name → device
	VNICs   map[string]VNICMatch // VM/NIC → match
	Addr    netip.Addr           // the host's own address
	Cgroups map[string]string    // VM → its CPU cgroup (CgroupInventory); nil: none known
	// Unnamed are running VMs that the policy does not name
	// (UnnamedLister); VNICs holds the matches of their vNICs.
	Unnamed []UnnamedVM
}

var (
	_ Inventory       = (*StaticInventory)(nil)
	_ CgroupInventory = (*StaticInventory)(nil)
	_ UnnamedLister   = (*StaticInventory)(nil)
)

// UnnamedVMs returns Unnamed.
func (s *StaticInventory) UnnamedVMs() []UnnamedVM { return s.Unnamed }

// VMs returns Running.
func (s *StaticInventory) VMs() ([]string, error) { return s.Running, nil }

// UplinkDevice returns Devices[uplink].
func (s *StaticInventory) UplinkDevice(uplink string) (string, error) {
	if d, ok := s.Devices[uplink]; ok {
		return d, nil
	}
	return "", fmt.Errorf("no device for uplink %q in the inventory", uplink)
}

// VNIC returns VNICs[port].
func (s *StaticInventory) VNIC(port string) (VNICMatch, bool) {
	m, ok := s.VNICs[port]
	return m, ok
}

// HostAddr returns Addr.
func (s *StaticInventory) HostAddr() netip.Addr { return s.Addr }

// VMCgroup returns Cgroups[vm].
func (s *StaticInventory) VMCgroup(vm string) (string, bool) {
	g, ok := s.Cgroups[vm]
	return g, ok && g != ""
}
