package lab

import (
	"fmt"
	"net"

	"sluice/agent"
)

// Inventory returns the static inventory of the named host for the agent:
// the VMs the plan puts on the host, its uplink veths, each of their
// vNICs recognised at its host-side veth (its lab index keeps its handles),
// and each VM's CPU cgroup (VMCgroup).
func (pl *Plan) Inventory(host string) (*agent.StaticInventory, error) {
	hp := pl.Host(host)
	if hp == nil {
		return nil, fmt.Errorf("lab: no host %q", host)
	}
	inv := &agent.StaticInventory{Devices: map[string]string{}, VNICs: map[string]agent.VNICMatch{}, Addr: hp.IP,
		Cgroups: map[string]string{}}
	for _, u := range hp.Uplinks {
		inv.Devices[u.Name] = u.Dev
	}
	for _, vm := range pl.VMs {
		if vm.Host != host {
			continue
		}
		inv.Running = append(inv.Running, vm.VM)
		inv.Cgroups[vm.VM] = VMCgroup(pl, vm.VM)
		for _, n := range vm.NICs {
			inv.VNICs[n.Port] = agent.VNICMatch{Index: n.GlobalIdx, HostDev: n.HostDev, SrcIP: n.IP, MAC: parseMAC(n.MAC)}
		}
	}
	return inv, nil
}

// parseMAC is the address s names; nil for "" or a malformed one.
func parseMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		return nil
	}
	return m
}
