package placement

import (
	"sort"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/policy"
)

// PortRate is the entitlement of one vNIC on its uplink.
type PortRate struct {
	Host, Uplink string
	Port         string  // VM/NIC
	RateBps      float64 // entitlement, bits/s
}

// Rates computes what every scheduled vNIC of a running VM is entitled to
// after the pass r: the desired state is derived (entitle.Derive) with the
// VMs where r placed them and r.DownUplinks down, and alloc divides each
// uplink's usable rate (DESIGN.md §2, additive). A vNIC's demand is
// demandBps[port] when given, else unbounded; classes the file names other
// than vm carry unbounded demand, the others none (as in `sluice alloc`).
// Ports are sorted by host, uplink and name.
func Rates(p *policy.Policy, r Result, demandBps map[string]float64) []PortRate {
	live := entitle.Live{Hosts: r.Placement, DownUplinks: map[string]bool{}}
	for _, u := range r.DownUplinks {
		live.DownUplinks[u] = true
	}
	n := entitle.NewNet(entitle.Derive(p, live))
	var out []PortRate
	for _, pt := range n.Ports {
		if pt.Kind != entitle.KindVNIC {
			continue
		}
		if d, ok := demandBps[pt.Name]; ok {
			pt.Node.Demand = d
		} else {
			pt.Node.Demand = alloc.Inf
		}
	}
	n.Compute()
	for _, pt := range n.Ports {
		if pt.Kind == entitle.KindVNIC {
			out = append(out, PortRate{Host: pt.Host, Uplink: pt.Uplink, Port: pt.Name, RateBps: pt.AllocBps()})
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
