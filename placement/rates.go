package placement

import (
	"sort"

	"sluice/alloc"
	"sluice/policy"
)

// PortRate is the entitlement of one vNIC on its uplink.
type PortRate struct {
	Host, Uplink string
	Port         string  // VM/NIC
	RateBps      float64 // entitlement, bits/s
}

// Rates computes what every vNIC of a running VM is entitled to after the
// pass r, with alloc (DESIGN.md §2, additive): per uplink, the tree uplink
// → traffic class → vNIC with the usable capacity of the uplink. A vNIC's
// demand is demandBps[port] when given, else unlimited; classes the file
// names other than vm carry unlimited demand, the others none (as in
// `sluice alloc`). Reserving vNICs are on the uplink r.NICUplinks gives,
// the others on their pinned uplink or the host's first. Ports are sorted by
// host, uplink and name.
func Rates(p *policy.Policy, r Result, demandBps map[string]float64) []PortRate {
	type key struct{ host, uplink string }
	ports := map[key][]*alloc.Node{}
	for _, v := range p.VMs {
		hn := r.Placement[v.Name]
		h := p.Host(hn)
		if h == nil || len(h.Uplinks) == 0 {
			continue
		}
		for _, n := range v.NICs {
			port := policy.PortName(v.Name, n.Name)
			up := r.NICUplinks[port]
			if up == "" {
				up = h.Uplinks[0].Name
				if n.Uplink != "" && h.Uplink(n.Uplink) != nil {
					up = n.Uplink
				}
			}
			d, ok := demandBps[port]
			if !ok {
				d = alloc.Inf
			}
			ports[key{hn, up}] = append(ports[key{hn, up}], &alloc.Node{Name: port,
				Reservation: float64(n.Reservation), Shares: float64(n.Shares), Limit: lim(n.Limit), Demand: d})
		}
	}
	var out []PortRate
	for k, vnics := range ports {
		u := p.Host(k.host).Uplink(k.uplink)
		capBps := float64(u.Usable)
		if capBps <= 0 {
			capBps = float64(u.Speed)
		}
		root := &alloc.Node{Name: k.host + "/" + k.uplink, Limit: alloc.Inf}
		for _, c := range p.TrafficClasses {
			cn := &alloc.Node{Name: c.Name, Reservation: float64(c.Reservation), Shares: float64(c.Shares), Limit: lim(c.Limit)}
			switch {
			case c.Name == "vm":
				cn.Children = vnics
				if c.Reservation == 0 {
					for _, vn := range vnics {
						cn.Reservation += vn.Reservation
					}
				}
			case c.Declared:
				cn.Demand = alloc.Inf
			default:
				continue
			}
			root.Children = append(root.Children, cn)
		}
		alloc.Compute(root, capBps)
		for _, vn := range vnics {
			out = append(out, PortRate{Host: k.host, Uplink: k.uplink, Port: vn.Name, RateBps: vn.Alloc})
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Host != out[b].Host {
			return out[a].Host < out[b].Host
		}
		if out[a].Uplink != out[b].Uplink {
			return out[a].Uplink < out[b].Uplink
		}
		return out[a].Port < out[b].Port
	})
	return out
}

func lim(l policy.Bps) float64 {
	if l == policy.Unlimited || l <= 0 {
		return alloc.Inf
	}
	return float64(l)
}
