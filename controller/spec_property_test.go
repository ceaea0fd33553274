package controller

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/cpuctl"
	"sluice/entitle"
	"sluice/internal/proptest"
	"sluice/policy"
	"sluice/storage"
)

// TestHostSideFromSpec: over random policies and placements, what each
// host enforces from the desired state the controller publishes (its part
// of the policy, after JSON) is what it would enforce from the whole
// policy: the agent's HTB trees and first step (vNIC classes, rates and
// entitlements) and its CPU settings, and the storage gateway's disks and
// their mClock parameters. The published derivation (Uplinks, Disks, CPU)
// is the whole policy's for that host. The policies have one to four
// hosts (some without CPU or memory), uplinks of several speeds, traffic
// classes, network pools, datastores, VMs with vNICs, disks and CPU
// settings placed anywhere or nowhere.
func TestHostSideFromSpec(t *testing.T) {
	n := proptest.Runs(t, 5000)
	rng := rand.New(rand.NewPCG(23, 2026))
	checked, hosts, vms, tries := 0, 0, 0, 0
	for ; checked < n; tries++ {
		if tries > 4*n {
			t.Fatalf("only %d of %d random policies were valid", checked, n)
		}
		text := randomSpecPolicy(rng)
		p, err := policy.Parse("rand.yaml", []byte(text))
		if err != nil {
			continue // an invalid draw: the generator aims near the edges
		}
		place := map[string]string{}
		for _, v := range p.VMs {
			if k := rng.IntN(len(p.Hosts) + 1); k < len(p.Hosts) {
				place[v.Name] = p.Hosts[k].Name
			}
		}
		whole := entitle.Derive(p, entitle.Live{Hosts: place})
		for host, dh := range desiredOf(p, place, nil, nil) {
			b, err := json.Marshal(dh)
			if err != nil {
				t.Fatal(err)
			}
			var got DesiredHost
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if msg := compareHostSide(p, place, whole, host, got); msg != "" {
				t.Fatalf("policy %d, host %s, placement %v:\n%s\n%s", checked, host, place, text, msg)
			}
			hosts++
			vms += len(got.VMs)
		}
		checked++
	}
	t.Logf("%d random policies (%d draws), %d hosts, %d placed VMs: each host's side from its part equals the whole policy's", checked, tries, hosts, vms)
}

// compareHostSide compares host's enforcement from the published d with
// the enforcement from the whole policy p placed as place.
func compareHostSide(p *policy.Policy, place map[string]string, whole *entitle.Desired, host string, d DesiredHost) string {
	// The whole policy as the host's daemons read it: VMs where placed.
	wp := *p
	wp.VMs = make([]policy.VM, len(p.VMs))
	for i, v := range p.VMs {
		v.Host = place[v.Name]
		wp.VMs[i] = v
	}
	running := []string{}
	for _, v := range wp.VMs {
		if v.Host == host {
			running = append(running, v.Name)
		}
	}
	if fmt.Sprint(running) != fmt.Sprint(partVMs(d.Policy)) {
		return fmt.Sprintf("the part's VMs %v, placed here %v", partVMs(d.Policy), running)
	}
	// The agent: trees, its first step, CPU.
	fromPart, err := hostAgent(d.Policy, host, running)
	if err != nil {
		return "agent from the part: " + err.Error()
	}
	fromWhole, err := hostAgent(&wp, host, running)
	if err != nil {
		return "agent from the whole policy: " + err.Error()
	}
	if fromPart != fromWhole {
		return fmt.Sprintf("the agent from the part:\n%s\nfrom the whole policy:\n%s", fromPart, fromWhole)
	}
	// The gateway.
	if a, b := fmt.Sprintf("%+v", storage.HostDisks(d.Policy, host)), fmt.Sprintf("%+v", storage.HostDisks(&wp, host)); a != b {
		return fmt.Sprintf("the gateway's disks from the part:\n%s\nfrom the whole policy:\n%s", a, b)
	}
	// What the controller publishes as derived is the whole derivation's.
	want := desiredPerHost(host, p, whole, place)
	got := d
	got.Policy, got.Revision = nil, 0
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		return fmt.Sprintf("published:\n%s\nwhole derivation:\n%s", gb, wb)
	}
	return ""
}

func partVMs(p *policy.Policy) []string {
	out := []string{}
	for _, v := range p.VMs {
		out = append(out, v.Name)
	}
	return out
}

// hostAgent runs an agent for host on p with the VMs running (fake
// kernel and cgroups) for one step and renders its trees and statistics.
func hostAgent(p *policy.Policy, host string, running []string) (string, error) {
	h := p.Host(host)
	inv := &agent.StaticInventory{Running: running, Devices: map[string]string{}, VNICs: map[string]agent.VNICMatch{},
		Addr: netip.MustParseAddr("198.18.1.1"), Cgroups: map[string]string{}}
	var devs []string
	for k, u := range h.Uplinks {
		dev := fmt.Sprintf("up%d", k)
		inv.Devices[u.Name] = dev
		devs = append(devs, dev)
	}
	idx := 0
	for _, v := range p.VMs {
		if v.Host != host {
			continue
		}
		inv.Cgroups[v.Name] = "vm-" + v.Name
		for _, nic := range v.NICs {
			idx++
			inv.VNICs[policy.PortName(v.Name, nic.Name)] = agent.VNICMatch{Index: idx, HostDev: fmt.Sprintf("tap%d", idx)}
		}
	}
	cg := cpuctl.NewFake()
	for _, g := range inv.Cgroups {
		cg.AddGroup(g)
	}
	a, err := agent.New(agent.Config{Policy: p, Host: host, Kernel: agent.NewFakeKernel(devs...), Inventory: inv, Cgroups: cg})
	if err != nil {
		return "", err
	}
	if _, err := a.Step(1e9); err != nil && !strings.Contains(err.Error(), "cpu") {
		return "", err
	}
	var b strings.Builder
	tb, _ := json.Marshal(a.Trees())
	sb, _ := json.Marshal(a.Stats())
	b.Write(tb)
	b.WriteByte('\n')
	b.Write(sb)
	return b.String(), nil
}

// randomSpecPolicy draws a policy with everything a host's part carries.
func randomSpecPolicy(rng *rand.Rand) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: r\nreservationCap: %s\n", []string{"0.5", "0.75", "1"}[rng.IntN(3)])
	if rng.IntN(2) == 0 {
		fmt.Fprintf(&b, "unnamedVMs: {shares: %d, reservation: %dMbps}\n", 1+rng.IntN(100), rng.IntN(50))
	}
	nh := 1 + rng.IntN(4)
	b.WriteString("hosts:\n")
	uplinks := make([][]string, nh)
	for h := range nh {
		fmt.Fprintf(&b, "  - name: h%d\n", h)
		if rng.IntN(3) > 0 {
			fmt.Fprintf(&b, "    cpu: {cores: %d, mhz: %d}\n    memory: %dGiB\n", 1+rng.IntN(16), 1000+rng.IntN(3000), 4+rng.IntN(256))
		}
		b.WriteString("    uplinks:\n")
		for u := range 1 + rng.IntN(3) {
			uplinks[h] = append(uplinks[h], fmt.Sprintf("u%d", u))
			fmt.Fprintf(&b, "      - {name: u%d, speed: %s}\n", u, []string{"1Gbps", "10Gbps", "25Gbps", "2.5Gbps"}[rng.IntN(4)])
		}
	}
	b.WriteString("trafficClasses:\n")
	for _, c := range policy.TrafficClassNames {
		if rng.IntN(2) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s: {shares: %d", c, 1+rng.IntN(100))
		if rng.IntN(3) == 0 {
			fmt.Fprintf(&b, ", reservation: %dMbps", rng.IntN(80))
		}
		b.WriteString("}\n")
	}
	pools := rng.IntN(3)
	if pools > 0 {
		b.WriteString("networkPools:\n")
		for k := range pools {
			fmt.Fprintf(&b, "  - {name: pool%d, reservation: %dMbps, portGroups: [pg%d]}\n", k, 100+rng.IntN(4000), k)
		}
	}
	nds := rng.IntN(3)
	if nds > 0 {
		b.WriteString("datastores:\n")
		for k := range nds {
			fmt.Fprintf(&b, "  - name: ds%d\n", k)
			if rng.IntN(2) == 0 {
				fmt.Fprintf(&b, "    array: {slots: %d, serviceTime: %dms}\n", 1+rng.IntN(32), 1+rng.IntN(10))
			}
		}
	}
	b.WriteString("vms:\n")
	for v := range rng.IntN(10) {
		fmt.Fprintf(&b, "  - name: vm%d\n", v)
		host := -1
		if rng.IntN(2) == 0 {
			host = rng.IntN(nh)
			fmt.Fprintf(&b, "    host: h%d\n", host)
		}
		if rng.IntN(2) == 0 {
			fmt.Fprintf(&b, "    cpu: {vcpus: %d, shares: %d", 1+rng.IntN(4), 1+rng.IntN(4000))
			if rng.IntN(2) == 0 {
				fmt.Fprintf(&b, ", reservationMHz: %d", rng.IntN(2000))
			}
			if rng.IntN(3) == 0 {
				fmt.Fprintf(&b, ", limitMHz: %d", 2000+rng.IntN(4000))
			}
			b.WriteString("}\n")
			fmt.Fprintf(&b, "    memory: %dMiB\n", 256+rng.IntN(4096))
		}
		b.WriteString("    nics:\n")
		for k := range 1 + rng.IntN(3) {
			fmt.Fprintf(&b, "      - {name: nic%d, shares: %d", k, 1+rng.IntN(100))
			if rng.IntN(2) == 0 {
				fmt.Fprintf(&b, ", reservation: %dMbps", rng.IntN(300))
			}
			if rng.IntN(4) == 0 {
				fmt.Fprintf(&b, ", limit: %dMbps", 300+rng.IntN(2000))
			}
			if pools > 0 && rng.IntN(2) == 0 {
				fmt.Fprintf(&b, ", portGroup: pg%d", rng.IntN(pools))
			}
			if host >= 0 && rng.IntN(4) == 0 {
				fmt.Fprintf(&b, ", uplink: %s", uplinks[host][rng.IntN(len(uplinks[host]))])
			}
			b.WriteString("}\n")
		}
		if nds > 0 && rng.IntN(2) == 0 {
			b.WriteString("    disks:\n")
			for k := range 1 + rng.IntN(2) {
				fmt.Fprintf(&b, "      - {name: d%d, datastore: ds%d, shares: %d, size: %dMiB", k, rng.IntN(nds), 1+rng.IntN(2000), 1+rng.IntN(64))
				if rng.IntN(2) == 0 {
					fmt.Fprintf(&b, ", reservationIOPS: %d", rng.IntN(300))
				}
				if rng.IntN(3) == 0 {
					fmt.Fprintf(&b, ", limitIOPS: %d", 300+rng.IntN(2000))
				}
				b.WriteString("}\n")
			}
		}
	}
	if pools > 0 {
		b.WriteString("portGroups: [")
		for k := range pools {
			if k > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "pg%d", k)
		}
		b.WriteString("]\n")
	}
	return b.String()
}
