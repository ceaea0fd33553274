package agent

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/policy"
)

const ingressPolicy = `cluster: t
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
trafficClasses: {vm: {shares: normal}}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, reservation: 100Mbps, ingress: {reservation: 400Mbps}}]}
  - {name: vm2, host: h1, nics: [{name: nic0, ingress: {shares: high, limit: 300Mbps}}]}
  - {name: vm3, host: h1, nics: [{name: nic0}]}
`

// ingressAgent is a dynamic agent of h1 of the policy text on k (with
// the state file record, "" for none) after its first step.
func ingressAgent(t *testing.T, k *FakeKernel, text, record string) *Agent {
	t.Helper()
	p, err := policy.Parse("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), Dynamic: true, RecordPath: record})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(1e9); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestIngressInstallUninstall: a policy with ingress settings gets an IFB
// for the uplink, a redirect of the uplink's ingress to it and an HTB
// tree on it with a class and a destination filter per vNIC with
// ingress (vm3 has none: it falls into the default class); a second step
// writes nothing; Uninstall gives the host back as it was, with and
// without the state file.
func TestIngressInstallUninstall(t *testing.T) {
	for _, withRecord := range []bool{true, false} {
		k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "sl-v2n0")
		before := k.String()
		record := t.TempDir() + "/state.json"
		a := ingressAgent(t, k, ingressPolicy, record)
		got := k.String()
		for _, want := range []string{
			"sl-up0: clsact, ingress u32 mirred redirect to sl-in-sl-up0",
			"sl-in-sl-up0: ifb",
			"sl-in-sl-up0: htb 1: default 10",
			"class 1:100 parent 1:11", // vm1/nic0 (inventory index 0)
			"class 1:101 parent 1:11", // vm2/nic0
			"filter 1 protocol all -> 1:100 match 00000800/0000ffff@-4 c6121001/ffffffff@16",
			"filter 2 protocol all -> 1:101 match 00000800/0000ffff@-4 c6121002/ffffffff@16",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("after the first step, missing %q in\n%s", want, got)
			}
		}
		if _, ifb, _ := strings.Cut(got, "sl-in-sl-up0: htb"); strings.Contains(ifb[:strings.Index(ifb, "sl-up0:")], "class 1:102") {
			t.Errorf("vm3/nic0 has no ingress and must have no inbound class:\n%s", got)
		}
		if ifb := a.Record().Ingress["sl-in-sl-up0"]; ifb != "sl-up0" {
			t.Errorf("record: ingress %v, want sl-in-sl-up0 -> sl-up0", a.Record().Ingress)
		}
		var inbound bool
		for _, u := range a.Stats().Uplinks {
			inbound = inbound || u.Direction == "inbound" && u.Dev == "sl-in-sl-up0"
		}
		if !inbound {
			t.Errorf("stats have no inbound tree: %+v", a.Stats().Uplinks)
		}
		if ch, err := a.Step(2e9); err != nil || ch.Qdisc != 0 || ch.FiltersSet != 0 {
			t.Errorf("second step: %v, %v: want no qdisc or filter write", ch, err)
		}
		var rec *Record
		if withRecord {
			r := a.Record()
			rec = &r
		}
		done, err := Uninstall(k, rec, UninstallOptions{KernelDefault: true}, []string{"sl-up0"}, []string{"sl-v0n0", "sl-v1n0", "sl-v2n0"})
		if err != nil {
			t.Fatalf("record %v: Uninstall: %v", withRecord, err)
		}
		if after := k.String(); after != before {
			t.Errorf("record %v: after Uninstall (%s):\n%s\nwant\n%s", withRecord, strings.Join(done, "; "), after, before)
		}
	}
}

// TestIngressMetrics: the inbound tree's ports are series of their own
// (uplink "up0/inbound"), so that /metrics gathers without a duplicate.
func TestIngressMetrics(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "sl-v2n0")
	a := ingressAgent(t, k, ingressPolicy, "")
	m := NewMetrics()
	m.Observe(a.Stats(), time.Millisecond, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var in int
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "uplink" && l.GetValue() == "up0/inbound" {
					in++
				}
			}
		}
	}
	if in == 0 {
		t.Error("no series of the inbound tree (uplink up0/inbound)")
	}
}

// TestIngressHostClasses: on the inbound tree, host traffic is what is
// sent to the host's address, to a class's ports or from them; with the
// class's DSCP too. NFS (2049) is matched as destination and as source.
func TestIngressHostClasses(t *testing.T) {
	a := ingressAgent(t, NewFakeKernel("sl-up0"), strings.Replace(ingressPolicy, "{vm: {shares: normal}}", "{vm: {shares: normal}, nfs: {ingress: {reservation: 100Mbps}}}", 1), "")
	var got []string
	for _, tr := range a.Trees() {
		if !tr.Inbound {
			continue
		}
		for _, f := range tr.Filters {
			if f.ClassID.Minor() != classMinorBase+2 { // nfs
				continue
			}
			var keys []string
			for _, k := range f.Keys {
				keys = append(keys, fmt.Sprintf("%08x/%08x@%d", k.Val, k.Mask, k.Off))
			}
			got = append(got, protoName(f)+strings.Join(keys, " "))
		}
	}
	// Every frame reaches the IFB: IPv4 is checked (EtherType 0800 at -4)
	// before the IPv4 header is read.
	want := []string{
		"all: 00000800/0000ffff@-4 c6120101/ffffffff@16 00000801/0000ffff@20", // to the host's port 2049
		"all: 00000800/0000ffff@-4 c6120101/ffffffff@16 08010000/ffff0000@20", // from port 2049
		"all: 00000800/0000ffff@-4 c6120101/ffffffff@16 00480000/00fc0000@0",  // DSCP 18
	}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("inbound nfs filters:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestIngressPolicyDropped: a new policy without ingress settings makes
// the next step remove the redirect and the IFB, and forget them in the
// record; the uplink keeps its tree.
func TestIngressPolicyDropped(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "sl-v2n0")
	a := ingressAgent(t, k, ingressPolicy, "")
	if _, ok := k.Devs["sl-in-sl-up0"]; !ok {
		t.Fatalf("no IFB after the first step:\n%s", k)
	}
	plain := regexp.MustCompile(`, ingress: \{[^}]*\}`).ReplaceAllString(ingressPolicy, "")
	if strings.Contains(plain, "ingress") {
		t.Fatalf("the test's policy still has ingress: %s", plain)
	}
	np, err := policy.Parse("t.yaml", []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetPolicy(np); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(2e9); err != nil {
		t.Fatal(err)
	}
	got := k.String()
	if strings.Contains(got, "sl-in-") || strings.Contains(got, "redirect") {
		t.Errorf("after the policy dropped ingress, inbound shaping is left:\n%s", got)
	}
	if !strings.Contains(got, "sl-up0: htb 1:") {
		t.Errorf("the uplink lost its tree:\n%s", got)
	}
	if len(a.Record().Ingress) != 0 {
		t.Errorf("record still has %v", a.Record().Ingress)
	}
}

// TestIngressMACFilter: inbound, a vNIC whose MAC the inventory knows (a
// libvirt domain's interface, a lab VM) gets the frames addressed to that
// MAC, as tc's `match ether dst` keys (aligned
// words at -16 and -12 before the network header); one with an IPv4
// address only, the packets to that address.
func TestIngressMACFilter(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(ingressPolicy))
	if err != nil {
		t.Fatal(err)
	}
	inv := testInventory(p, "h1")
	m := inv.VNICs["vm1/nic0"]
	m.MAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x51, 0x01, 0x02}
	inv.VNICs["vm1/nic0"] = m
	a, err := New(Config{Policy: p, Host: "h1", Kernel: NewFakeKernel("sl-up0"), Inventory: inv, Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tr := range a.Trees() {
		if !tr.Inbound {
			continue
		}
		for _, f := range tr.Filters {
			if f.Handle >= hostFilterBase {
				continue // host classes
			}
			var keys []string
			for _, k := range f.Keys {
				keys = append(keys, fmt.Sprintf("%08x/%08x@%d", k.Val, k.Mask, k.Off))
			}
			got = append(got, fmt.Sprintf("%d→%s: %s%s", f.Handle, f.ClassID, protoName(f), strings.Join(keys, " ")))
		}
	}
	want := []string{
		"1→1:100: all: 00005254/0000ffff@-16 00510102/ffffffff@-12", // vm1 by its MAC, IPv4, IPv6 and ARP alike
		"2→1:101: all: 00000800/0000ffff@-4 c6121002/ffffffff@16",   // vm2 by its IPv4 address (vm3 has no ingress setting)
	}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("inbound vNIC filters:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// protoName is "all: " for a filter of every EtherType, "ip: " for one of
// IPv4 only.
func protoName(f Filter) string {
	if f.AnyEtherType {
		return "all: "
	}
	return "ip: "
}

// TestIngressFiltersFromIPv4Only: an IFB whose filters an older agent made
// for IPv4 only (protocol ip, no EtherType key) gets filters of every
// EtherType at the next step: those of protocol ip are deleted first (the
// kernel keeps one protocol per priority, as the fake does), then the new
// ones set, without an error; the step after writes nothing.
func TestIngressFiltersFromIPv4Only(t *testing.T) {
	k := NewFakeKernel("sl-up0", "sl-v0n0", "sl-v1n0", "sl-v2n0")
	a := ingressAgent(t, k, ingressPolicy, "")
	d, err := k.dev(IFBName("sl-up0"))
	if err != nil {
		t.Fatal(err)
	}
	n := len(d.Filters)
	for h, f := range d.Filters {
		f.AnyEtherType = false
		if len(f.Keys) > 0 && f.Keys[0] == etherTypeIPv4Key {
			f.Keys = f.Keys[1:]
		}
		d.Filters[h] = f
	}
	ch, err := a.Step(2e9)
	if err != nil {
		t.Fatalf("step over IPv4-only filters: %v", err)
	}
	if ch.FiltersDeleted != n || ch.FiltersSet != n {
		t.Errorf("step over %d IPv4-only filters: %d deleted, %d set; want all of them replaced", n, ch.FiltersDeleted, ch.FiltersSet)
	}
	for _, f := range d.Filters {
		if !f.AnyEtherType {
			t.Errorf("filter %d is still of protocol ip", f.Handle)
		}
	}
	if ch, err := a.Step(3e9); err != nil || ch.FiltersSet+ch.FiltersDeleted != 0 {
		t.Errorf("the step after: %+v, %v: want no filter written", ch, err)
	}
}
