package main

import (
	"fmt"
	"time"

	"sluice/agent"
	"sluice/entitle"
	"sluice/policy"
)

// nicLines say, for each uplink port sends through (outbound), what the
// agent of its host last read of the uplink's NIC, from the agent's
// statistics file in stateDir: the NIC, the root qdisc sluice replaced,
// the warnings. Nothing when port is no port or the host's file is not
// there (no agent runs on this machine). Like throttleLines, these are
// host-local lines: only the port's host can say them, so they come from
// its file and are never computed by package explain.
func nicLines(p *policy.Policy, live entitle.Live, port, stateDir string) []string {
	var out []string
	stats := map[string]*agent.Stats{}
	for _, pt := range entitle.NewNet(entitle.Derive(p, live)).Port(port) {
		if pt.Tree.Spec.Inbound {
			continue
		}
		s, ok := stats[pt.Host]
		if !ok {
			s, _ = agent.ReadStats(stateDir, p.Cluster, pt.Host)
			stats[pt.Host] = s
		}
		if s == nil {
			continue
		}
		for _, u := range s.Uplinks {
			if u.Uplink != pt.Uplink || u.Direction != "" || u.NIC == nil {
				continue
			}
			n := u.NIC
			ago := time.Since(time.Unix(0, n.ReadNs)).Round(time.Second)
			out = append(out, fmt.Sprintf("live, NIC of uplink %s on host %s (%s, read by its agent %s ago; %s):",
				u.Uplink, pt.Host, u.Dev, ago, agent.StatsPath(stateDir, p.Cluster, pt.Host)))
			root := ""
			if n.RootBefore != "" {
				root = "; root qdisc before sluice: " + n.RootBefore
			}
			out = append(out, "  "+n.Summary()+root)
			if n.Error != "" {
				out = append(out, "  error: "+n.Error)
			}
			for _, w := range n.Warnings {
				out = append(out, "  warning: "+w)
			}
		}
	}
	return out
}
