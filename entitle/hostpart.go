package entitle

import "sluice/policy"

// HostParts splits p by host for the hosts' daemons: each host's part is
// what its agent and its storage gateway derive their enforcement from,
// and nothing else. A part has
//   - the one host, with its uplinks and CPU;
//   - the VMs placed on it (place: VM → host; nil: the hosts p gives),
//     in file order, each with Host set to it: those that run there get
//     their classes, disks and CPU setting, those that are off are known
//     for admission and get them as soon as they start;
//   - every cluster-wide definition the derivation reads: reservationCap,
//     the traffic classes, network pools, port groups, datastores and the
//     unnamedVMs setting.
//
// For every host h, Derive(parts[h], live on h) gives h's uplink trees and
// disks as Derive(p, live) does: a host never needs the whole policy, and
// a change to another host's VMs leaves its part as it was. Only the hosts
// named in only get a part (nil: every host of p, also those without VMs).
// Parts share p's slices: they are read, never changed.
func HostParts(p *policy.Policy, place map[string]string, only map[string]bool) map[string]*policy.Policy {
	out := make(map[string]*policy.Policy, len(p.Hosts))
	for i := range p.Hosts {
		if only != nil && !only[p.Hosts[i].Name] {
			continue
		}
		q := *p
		q.Hosts = p.Hosts[i : i+1 : i+1]
		q.VMs = nil
		out[p.Hosts[i].Name] = &q
	}
	for i := range p.VMs {
		h := p.VMs[i].Host
		if place != nil {
			h = place[p.VMs[i].Name]
		}
		q := out[h]
		if q == nil {
			continue // not placed, on a host p does not have, or not asked for
		}
		vm := p.VMs[i]
		vm.Host = h
		q.VMs = append(q.VMs, vm)
	}
	return out
}
