package hostside

import (
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"sluice/agent"
	"sluice/lab"
)

// LabInventory is the lab's inventory of a host whose VMs come and go by
// migration: it knows the vNICs of every VM of the lab, and runs the VMs
// the controller puts on the host that are plugged here (Side sets them).
type LabInventory struct {
	base *agent.StaticInventory // devices, address, cgroups of the host
	mu   sync.Mutex
	run  []string
	all  map[string]agent.VNICMatch
}

// NewLabInventory is host's inventory in the lab pl, running no VM yet.
func NewLabInventory(pl *lab.Plan, host string) (*LabInventory, error) {
	base, err := pl.Inventory(host)
	if err != nil {
		return nil, err
	}
	m := &LabInventory{base: base, all: map[string]agent.VNICMatch{}}
	for _, v := range pl.VMs {
		for _, n := range v.NICs {
			mac, _ := net.ParseMAC(n.MAC)
			m.all[n.Port] = agent.VNICMatch{Index: n.GlobalIdx, HostDev: n.HostDev, SrcIP: n.IP, MAC: mac}
		}
	}
	return m, nil
}

// VMs returns the VMs that run on the host, sorted.
func (m *LabInventory) VMs() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.run), nil
}

func (m *LabInventory) setRunning(vms []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.run = slices.Clone(vms)
	sort.Strings(m.run)
}

// UplinkDevice is the host's device of uplink u.
func (m *LabInventory) UplinkDevice(u string) (string, error) { return m.base.UplinkDevice(u) }

// VNIC matches port (VM/NIC) when its VM runs on the host.
func (m *LabInventory) VNIC(port string) (agent.VNICMatch, bool) {
	vm, _, _ := strings.Cut(port, "/")
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.run, vm) {
		return agent.VNICMatch{}, false
	}
	v, ok := m.all[port]
	return v, ok
}

// HostAddr is the host's address in the lab.
func (m *LabInventory) HostAddr() netip.Addr { return m.base.HostAddr() }

// VMCgroup is vm's cgroup on the host.
func (m *LabInventory) VMCgroup(vm string) (string, bool) { return m.base.VMCgroup(vm) }
