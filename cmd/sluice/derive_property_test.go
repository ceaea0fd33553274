package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/alloc"
	"sluice/entitle"
	"sluice/internal/proptest"
	"sluice/placement"
	"sluice/policy"
	"sluice/sim"
)

// TestOneDerivation checks, over random policies, that the four users of
// the derivation agree exactly on every scheduled vNIC: `sluice alloc -o
// json`, the agent (its first decide step, and its entitlements on given
// demands), the simulator's entitlements and placement's rates give the
// same uplink and the same rate in bits/s (rounded as the JSON prints).
// The policies have several hosts and uplinks, pinned and unpinned vNICs,
// passthrough vNICs, limits at their edge values (1 bps, equal to the
// reservation, 100 Tbps, unlimited), usable rates below what is reserved
// (shortage), idle and partly busy vNICs, and VMs without a host. The
// agent and `sluice alloc --unnamed` also agree with running VMs that the
// policy does not name (the simulator and placement have none).
func TestOneDerivation(t *testing.T) {
	n := proptest.Runs(t, 2000)
	rng := rand.New(rand.NewPCG(13, 2026))
	dir := t.TempDir()
	checked, vnics, notFirst, passthrough, unnamedNICs := 0, 0, 0, 0, 0
	for tries := 0; checked < n; tries++ {
		if tries > 4*n {
			t.Fatalf("only %d of %d random policies were valid", checked, n)
		}
		text := randomPolicy(rng)
		p, err := policy.Parse("rand.yaml", []byte(text))
		if err != nil {
			continue // an invalid draw: the generator aims near the edges
		}
		demand := randomDemands(rng, p)
		unnamed := randomUnnamed(rng, p)
		cliDefault, msg := compareDerivations(t, dir, checked, text, p, demand, unnamed)
		if msg != "" {
			t.Fatalf("policy %d:\n%s\ndemands %v\nunnamed %v\n%s", checked, text, demand, unnamed, msg)
		}
		for _, u := range unnamed {
			unnamedNICs += len(u.NICs)
		}
		checked++
		vnics += len(demand)
		for _, a := range cliDefault {
			if !strings.HasSuffix(a.where, "/u0") {
				notFirst++
			}
		}
		for _, vm := range p.VMs {
			for _, nic := range vm.NICs {
				if nic.Passthrough {
					passthrough++
				}
			}
		}
	}
	t.Logf("%d policies; %d vNICs with a drawn demand, %d scheduled on an uplink other than the first, %d passthrough, %d of unnamed VMs", checked, vnics, notFirst, passthrough, unnamedNICs)
	if notFirst == 0 || passthrough == 0 || unnamedNICs == 0 {
		t.Error("the random policies never exercised best fit, passthrough or unnamed VMs")
	}
}

type portAt struct {
	where string // HOST/UPLINK
	bps   int64
}

// compareDerivations compares the derivations of policy i (text, parsed
// as p) with sluice alloc's, and returns sluice alloc's vNICs at its
// default demands and what differed ("" when nothing).
func compareDerivations(t *testing.T, dir string, i int, text string, p *policy.Policy, demand map[string]float64, unnamed []entitle.UnnamedVM) (cliDefault map[string]portAt, msg string) {
	t.Helper()
	file := filepath.Join(dir, fmt.Sprintf("p%d.yaml", i))
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := allocJSON(t, file, demand, nil)
	cliDefault = allocJSON(t, file, nil, nil)
	// The agent also sees the running VMs that the policy does not name.
	cliU, cliUDefault := cli, cliDefault
	if len(unnamed) > 0 {
		cliU, cliUDefault = allocJSON(t, file, demand, unnamed), allocJSON(t, file, nil, unnamed)
	}

	var msgs []string
	diff := func(who string, got, want map[string]portAt) {
		for _, port := range sortedPorts(want, got) {
			if got[port] != want[port] {
				msgs = append(msgs, fmt.Sprintf("%s: %s: %v, sluice alloc: %v", who, port, got[port], want[port]))
			}
		}
	}

	// The simulator.
	ents, err := sim.Entitlements(p, demand)
	if err != nil {
		return cliDefault, "sim: " + err.Error()
	}
	got := map[string]portAt{}
	for _, e := range ents {
		got[e.Port] = portAt{e.Host + "/" + e.Uplink, int64(math.Round(e.AllocBps))}
	}
	diff("sim", got, cli)

	// Placement.
	r := placement.Result{Placement: placement.Placement{}}
	for _, vm := range p.VMs {
		if vm.Host != "" {
			r.Placement[vm.Name] = vm.Host
		}
	}
	got = map[string]portAt{}
	for _, pr := range placement.Rates(p, r, demand) {
		got[pr.Port] = portAt{pr.Host + "/" + pr.Uplink, int64(math.Round(pr.RateBps))}
	}
	diff("placement.Rates", got, cli)

	// The agent of every host: its first decide step (nothing measured:
	// every vNIC and declared class may want everything, as sluice alloc's
	// defaults), and its entitlements on the drawn demands.
	first, given := map[string]portAt{}, map[string]portAt{}
	for _, h := range p.Hosts {
		inv := staticInventory(p, h.Name, unnamed)
		var devs []string
		for _, d := range inv.Devices {
			devs = append(devs, d)
		}
		a, err := agent.New(agent.Config{Policy: p, Host: h.Name, Kernel: agent.NewFakeKernel(devs...), Inventory: inv, Dynamic: true})
		if err != nil {
			return cliDefault, "agent: " + err.Error()
		}
		d := a.Decide(a.Measure(1))
		for ui, us := range d.Stats.Uplinks {
			for _, ps := range us.Ports {
				if vm, _, _ := strings.Cut(ps.Port, "/"); p.VM(vm) != nil || isUnnamed(unnamed, vm) {
					first[ps.Port] = portAt{h.Name + "/" + a.Trees()[ui].Uplink, int64(ps.EntitlementBps)}
				}
			}
		}
		for _, tr := range a.Trees() {
			dm := map[string]float64{}
			for _, nd := range tr.Nodes {
				switch {
				case nd.IsNIC:
					dm[nd.Name] = alloc.Inf
					if v, ok := demand[nd.Name]; ok {
						dm[nd.Name] = v
					}
				case nd.Declared:
					dm[nd.Name] = alloc.Inf
				}
			}
			ent := tr.Entitlements(dm)
			for _, nd := range tr.Nodes {
				if nd.IsNIC {
					given[nd.Name] = portAt{h.Name + "/" + tr.Uplink, int64(math.Round(ent[nd.Name]))}
				}
			}
		}
	}
	diff("agent decide", first, cliUDefault)
	diff("agent entitlements", given, cliU)
	return cliDefault, strings.Join(msgs, "\n")
}

// allocJSON runs `sluice alloc FILE -o json` with the demands and the
// unnamed VMs (--unnamed) and returns
// its vNICs.
func allocJSON(t *testing.T, file string, demand map[string]float64, unnamed []entitle.UnnamedVM) map[string]portAt {
	t.Helper()
	args := []string{"alloc", file, "-o", "json"}
	for _, u := range unnamed {
		for _, n := range u.NICs {
			args = append(args, "--unnamed", u.Host+"/"+u.Name+"/"+n)
		}
	}
	for _, port := range sortedKeys(demand) {
		v := "unlimited"
		if !math.IsInf(demand[port], 1) {
			v = fmt.Sprintf("%.0fbps", demand[port])
		}
		args = append(args, "--demand", port+"="+v)
	}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != exitOK {
		t.Fatalf("sluice %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	var rows []allocRow
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	m := map[string]portAt{}
	for _, r := range rows {
		if r.Kind == "vnic" {
			m[r.Port] = portAt{r.Host + "/" + r.Uplink, r.AllocBps}
		}
	}
	return m
}

// staticInventory lays out a host's uplinks and vNICs for the agent.
func staticInventory(p *policy.Policy, host string, unnamed []entitle.UnnamedVM) *agent.StaticInventory {
	inv := &agent.StaticInventory{Devices: map[string]string{}, VNICs: map[string]agent.VNICMatch{},
		Addr: netip.MustParseAddr("198.18.1.1")}
	for k, u := range p.Host(host).Uplinks {
		inv.Devices[u.Name] = fmt.Sprintf("sl-up%d", k)
	}
	k := 0
	for _, vm := range p.VMs {
		for _, n := range vm.NICs {
			if vm.Host == host {
				inv.VNICs[policy.PortName(vm.Name, n.Name)] = agent.VNICMatch{Index: k, SrcIP: netip.AddrFrom4([4]byte{198, 18, 16, byte(k + 1)})}
			}
			k++
		}
		if vm.Host == host {
			inv.Running = append(inv.Running, vm.Name)
		}
	}
	for _, u := range unnamed {
		if u.Host == host {
			inv.Unnamed = append(inv.Unnamed, agent.UnnamedVM{Name: u.Name, NICs: u.NICs})
			for _, n := range u.NICs {
				inv.VNICs[u.Name+"/"+n] = agent.VNICMatch{Index: k}
				k++
			}
		}
	}
	return inv
}

// randomUnnamed draws running VMs that the policy does not name: for
// half of the policies none, for the others one to three on random hosts
// with one or two vNICs each.
func randomUnnamed(rng *rand.Rand, p *policy.Policy) []entitle.UnnamedVM {
	var out []entitle.UnnamedVM
	if rng.IntN(2) == 0 {
		return nil
	}
	for i := range 1 + rng.IntN(3) {
		u := entitle.UnnamedVM{Name: fmt.Sprintf("dom%d", i), Host: p.Hosts[rng.IntN(len(p.Hosts))].Name}
		for k := range 1 + rng.IntN(2) {
			u.NICs = append(u.NICs, fmt.Sprintf("vnet%d", k))
		}
		out = append(out, u)
	}
	return out
}

func isUnnamed(unnamed []entitle.UnnamedVM, vm string) bool {
	for _, u := range unnamed {
		if u.Name == vm {
			return true
		}
	}
	return false
}

var speeds = []string{"1Gbps", "10Gbps", "25Gbps"}

// randomPolicy draws a policy near the edges of the rules.
func randomPolicy(rng *rand.Rand) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: r\nreservationCap: %s\n", []string{"0.5", "0.75", "1"}[rng.IntN(3)])
	if rng.IntN(2) == 0 {
		fmt.Fprintf(&b, "unnamedVMs: {shares: %d, reservation: %dMbps%s}\n", 1+rng.IntN(100), rng.IntN(100), limitField(rng, 100e6))
	}
	b.WriteString("hosts:\n")
	nh := 1 + rng.IntN(3)
	uplinks := make([][]string, nh)
	for h := range nh {
		fmt.Fprintf(&b, "  - name: h%d\n    uplinks:\n", h)
		for u := range 1 + rng.IntN(3) {
			sp := speeds[rng.IntN(len(speeds))]
			uplinks[h] = append(uplinks[h], fmt.Sprintf("u%d", u))
			usable := ""
			switch rng.IntN(3) {
			case 0:
				usable = ", usable: " + sp
			case 1:
				// Well below the speed: reservations can exceed it.
				usable = fmt.Sprintf(", usable: %dMbps", 1+rng.IntN(600))
			}
			fmt.Fprintf(&b, "      - {name: u%d, speed: %s%s}\n", u, sp, usable)
		}
	}
	b.WriteString("trafficClasses:\n")
	for _, c := range policy.TrafficClassNames {
		if rng.IntN(3) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s: {shares: %d", c, 1+rng.IntN(100))
		if c != "vm" || rng.IntN(2) == 0 {
			if r := rng.IntN(3); r > 0 {
				fmt.Fprintf(&b, ", reservation: %dMbps", rng.IntN(150))
			}
		}
		b.WriteString(limitField(rng, 150e6))
		b.WriteString("}\n")
	}
	b.WriteString("vms:\n")
	for v := range rng.IntN(9) {
		h := rng.IntN(nh + 1) // nh: no host
		fmt.Fprintf(&b, "  - name: vm%d\n", v)
		if h < nh {
			fmt.Fprintf(&b, "    host: h%d\n", h)
		}
		b.WriteString("    nics:\n")
		for k := range 1 + rng.IntN(3) {
			fmt.Fprintf(&b, "      - {name: nic%d", k)
			if rng.IntN(8) == 0 {
				b.WriteString(", passthrough: true}\n")
				continue
			}
			if h < nh && rng.IntN(3) == 0 {
				fmt.Fprintf(&b, ", uplink: %s", uplinks[h][rng.IntN(len(uplinks[h]))])
			}
			res := 0
			if rng.IntN(2) == 0 {
				res = rng.IntN(400)
				fmt.Fprintf(&b, ", reservation: %dMbps", res)
			}
			fmt.Fprintf(&b, ", shares: %d", 1+rng.IntN(100))
			b.WriteString(limitField(rng, float64(res)*1e6))
			b.WriteString("}\n")
		}
	}
	return b.String()
}

// limitField draws a limit: none, unlimited, equal to the reservation, 1
// bps, 100 Tbps, or a random rate (the file rejects one below the
// reservation; the draw is then skipped).
func limitField(rng *rand.Rand, resBps float64) string {
	switch rng.IntN(7) {
	case 0:
		return ", limit: unlimited"
	case 1:
		if resBps > 0 {
			return fmt.Sprintf(", limit: %.0fbps", resBps)
		}
		return ", limit: 1bps"
	case 2:
		return ", limit: 1bps"
	case 3:
		return ", limit: 100Tbps"
	case 4:
		return fmt.Sprintf(", limit: %dMbps", 1+rng.IntN(2000))
	}
	return ""
}

// randomDemands draws the demand of some vNICs of placed VMs: idle (0), a
// rate, or unbounded; the others keep the default (unbounded).
func randomDemands(rng *rand.Rand, p *policy.Policy) map[string]float64 {
	d := map[string]float64{}
	for _, vm := range p.VMs {
		for _, n := range vm.NICs {
			if vm.Host == "" || n.Passthrough || rng.IntN(2) == 0 {
				continue
			}
			switch rng.IntN(3) {
			case 0:
				d[policy.PortName(vm.Name, n.Name)] = 0
			case 1:
				d[policy.PortName(vm.Name, n.Name)] = float64(rng.IntN(1_000_000_000))
			default:
				d[policy.PortName(vm.Name, n.Name)] = alloc.Inf
			}
		}
	}
	return d
}

func sortedPorts(a, b map[string]portAt) []string {
	m := map[string]bool{}
	for k := range a {
		m[k] = true
	}
	for k := range b {
		m[k] = true
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedKeys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
