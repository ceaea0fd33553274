package main

import (
	"fmt"

	"sluice/agent"
	"sluice/entitle"
	"sluice/policy"
)

// vfLiveLines says which VF of its PF the SR-IOV VF vNIC port uses and
// what rates it has, as its host's agent last reported them (its
// statistics file in stateDir, on the host it runs on); nothing when the
// port is no VF vNIC or the file is not there.
func vfLiveLines(p *policy.Policy, live entitle.Live, port, stateDir string) []string {
	for _, u := range entitle.Derive(p, live).Uplinks {
		for _, v := range u.VFs {
			if v.Port != port {
				continue
			}
			s, err := agent.ReadStats(stateDir, p.Cluster, u.Host)
			if err != nil || s == nil {
				return nil
			}
			for _, f := range s.VFs {
				if f.Port != port {
					continue
				}
				head := fmt.Sprintf("live, agent of host %s (%s):", u.Host, agent.StatsPath(stateDir, p.Cluster, u.Host))
				if f.Index < 0 {
					return []string{head, "  " + f.Error}
				}
				out := []string{head, fmt.Sprintf("  VF %d of PF %s (PCI %s): %s", f.Index, f.PF, f.PCI, f.Have)}
				if f.Error != "" {
					out = append(out, "  "+f.Error)
				}
				return out
			}
		}
	}
	return nil
}
