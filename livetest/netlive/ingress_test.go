package netlive

import (
	"fmt"
	"math"
	"os/exec"
	"strings"
	"testing"

	"sluice/agent"
	"sluice/livetest/livelab"
)

const ingressPolicy = `# Issue 27: three VMs receive from the fabric through one 1 Gbps uplink
# with unequal inbound reservation, shares and limit; their sending side
# has settings of its own.
cluster: nin
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, shares: normal, reservation: 100Mbps, ingress: {reservation: 400Mbps, shares: normal}}]}
  - {name: vm2, host: h1, nics: [{name: nic0, shares: high, ingress: {shares: high, limit: 250Mbps}}]}
  - {name: vm3, host: h1, nics: [{name: nic0, shares: low, ingress: {shares: low}}]}
`

// TestIngressRSL: what three VMs receive through one uplink (iperf3 -R:
// the fabric's servers send) is shaped on the uplink's IFB: with the
// inbound usable rate measured first, each VM's received rate (median of
// the judged seconds) is within ±5% of its inbound entitlement under
// dynamic enforcement; then, with the same agent, what they send is
// within ±5% of their outbound entitlements, as before. vm1 (the one
// that reserves) and vm2 (the limited one) have no IPv4 address: they
// receive and send IPv6 only, classified like vm3's IPv4 (by MAC
// inbound, at the vNIC outbound).
func TestIngressRSL(t *testing.T) {
	l := upLab(t, ingressPolicy)
	l.onlyIPv6("vm1/nic0")
	l.onlyIPv6("vm2/nic0")
	in := l.inbound()
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	usableOut := l.measureUsable("h1", ports...)
	usableIn := in.measureUsable("h1", ports...)
	l.requireIngressShaping("h1")
	p := l.withUsable(usableIn)
	a, stop := l.runAgent(p, "h1", true)
	defer func() {
		stop()
		t.Logf("agent stats at the end: %s", statsLine(a))
	}()

	check := func(what string, lab *liveLab, usable float64, want map[string]float64) {
		var fl []flow
		for _, port := range ports {
			fl = append(fl, lab.nicFlow(port, 1))
		}
		res := lab.runSaturating("h1", 12, warmupS, usable, fl...)
		var b strings.Builder
		fmt.Fprintf(&b, "%s, usable %s Mbps (median of the judged 1-s rates after %d s warm-up)\n", what, mbps(usable), warmupS)
		fmt.Fprintf(&b, "%-9s %-4s %9s %9s %8s\n", "port", "IP", "entitled", "got", "err")
		for _, r := range res {
			got := r.median(warmupS)
			e := relErr(got, want[r.Name])
			fam := map[bool]string{true: "v6", false: "v4"}[lab.ipv6[r.Name]]
			fmt.Fprintf(&b, "%-9s %-4s %9s %9s %+7.1f%%   per second: %s\n", r.Name, fam, mbps(want[r.Name]), mbps(got), 100*e, r.series())
			if math.Abs(e) > 0.05 {
				t.Errorf("%s %s: got %s Mbps, entitled %s Mbps: error %+.1f%% exceeds ±5%%", what, r.Name, mbps(got), mbps(want[r.Name]), 100*e)
			}
		}
		t.Log("\n" + b.String())
	}
	check("inbound (received)", in, usableIn, livelab.InboundEntitlements(p, "h1", usableIn, append([]string{"h1/vm"}, ports...)...))
	check("outbound (sent)", l, usableOut, livelab.Entitlements(l.withUsable(usableOut), "h1", usableOut, append([]string{"h1/vm"}, ports...)...))
}

// requireIngressShaping fails the test, with the reason, when the host's
// first uplink has no IFB with sluice's redirect after the agent ran
// (measureUsable ran it): the kernel lacks IFB or mirred.
func (l *liveLab) requireIngressShaping(host string) {
	l.t.Helper()
	dev, err := l.uplinkDev(host)
	if err != nil {
		l.t.Fatal(err)
	}
	ns := l.plan.Host(host).Name
	out, err := exec.Command("tc", "-n", ns, "filter", "show", "dev", dev, "ingress").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mirred") || !strings.Contains(string(out), "sl-in-") {
		l.t.Fatalf("no ingress redirect to an IFB on %s in %s (the kernel needs ifb and act_mirred): %v %s", dev, ns, err, out)
	}
	l.t.Logf("ingress of %s: %s", dev, strings.Join(strings.Fields(string(out)), " "))
	// The vNICs are matched by their MAC (the lab's inventory gives it):
	// tc shows the destination address's keys at -16 and -12.
	ifb := agent.IFBName(dev)
	out, err = exec.Command("tc", "-n", ns, "filter", "show", "dev", ifb).CombinedOutput()
	if n := strings.Count(string(out), "at -16"); err != nil || n < len(l.plan.VMs) {
		l.t.Fatalf("%s in %s: %d filters by destination MAC, want one per vNIC (%d): %v %s", ifb, ns, n, len(l.plan.VMs), err, out)
	}
}

// TestIngressUninstallGivesBack: the agent's inbound shaping (the IFB,
// the clsact qdisc and the redirect on the uplink, the IFB's HTB tree) is
// installed through netlink, a second step changes no qdisc or filter,
// and Uninstall gives the host back as `ip link` and `tc` saw it before
// (with the state file, and without it from the uplink's redirect to an
// IFB of sluice's name); a second Uninstall does nothing.
func TestIngressUninstallGivesBack(t *testing.T) {
	l := upLab(t, strings.ReplaceAll(ingressPolicy, "cluster: nin", "cluster: niu"))
	ns := l.plan.Host("h1").Name
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return string(out)
	}
	show := func() string {
		return run("ip", "-o", "link", "show") + run("tc", "-j", "qdisc", "show", "dev", "sl-up0") +
			run("tc", "filter", "show", "dev", "sl-up0", "ingress")
	}
	for _, withRecord := range []bool{true, false} {
		before := show()
		roots := t.TempDir()
		a, k := l.installAgent("h1", t.TempDir()+"/state.json", roots)
		installed := show()
		ifbTree := run("tc", "class", "show", "dev", agent.IFBName("sl-up0")) + run("tc", "filter", "show", "dev", agent.IFBName("sl-up0"))
		for _, want := range []string{"sl-in-sl-up0", "clsact", "Egress Redirect to device sl-in-sl-up0"} {
			if !strings.Contains(installed, want) {
				t.Fatalf("after the first step, %q is missing:\n%s", want, installed)
			}
		}
		// One class and one destination filter per vNIC with ingress.
		for _, want := range []string{"class htb 1:100", "class htb 1:101", "class htb 1:102", "flowid 1:100", "flowid 1:101", "flowid 1:102"} {
			if !strings.Contains(ifbTree, want) {
				t.Fatalf("the IFB's tree lacks %q:\n%s", want, ifbTree)
			}
		}
		if ch, err := a.Step(agent.NowNs()); err != nil || ch.Qdisc != 0 || ch.FiltersSet != 0 || ch.FiltersDeleted != 0 {
			t.Errorf("second step: %v, %v: want no qdisc or filter written", ch, err)
		}
		rec := a.Record()
		use := &rec
		if !withRecord {
			use = nil
		}
		for i := 0; i < 2; i++ {
			done, err := agent.Uninstall(k, use, agent.UninstallOptions{RootsDir: roots, KernelDefault: true}, []string{"sl-up0"}, nil)
			if err != nil {
				t.Fatalf("record %v: uninstall %d: %v", withRecord, i+1, err)
			}
			t.Logf("record %v: uninstall %d: %s", withRecord, i+1, strings.Join(done, "; "))
			if i == 1 && len(done) != 0 {
				t.Errorf("a second uninstall did %v", done)
			}
			if after := show(); after != before {
				t.Errorf("record %v: after uninstall %d:\n%s\nbefore install:\n%s", withRecord, i+1, after, before)
			}
		}
		k.Close()
	}
}

// TestFilterProtocolChange: on the real kernel, a u32 filter of every
// EtherType cannot join filters of protocol ip at the same priority
// (EINVAL, which the fake kernel models), and Reconcile replaces an IFB's
// protocol-ip filters (an older agent's) with the new ones: it deletes
// those first, sets the new one with all its keys (read back equal), and
// a second Reconcile writes nothing.
func TestFilterProtocolChange(t *testing.T) {
	requireLive(t)
	const ns, dev = "sl-fproto", "sl-fp0"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	for _, args := range [][]string{{"netns", "add", ns}, {"-n", ns, "link", "add", dev, "type", "veth", "peer", "name", "sl-fp1"}, {"-n", ns, "link", "set", dev, "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	k, err := agent.NewNetlinkKernel(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	class := agent.HTBClass{ID: agent.MakeHandle(1, 10), Parent: agent.MakeHandle(1, 0), RateBps: 1e6, CeilBps: 1e6}
	if _, err := agent.Reconcile(k, dev, 10, []agent.HTBClass{class}, nil, nil); err != nil {
		t.Fatal(err)
	}
	for h := uint32(1); h <= 2; h++ {
		old := agent.Filter{Handle: h, ClassID: class.ID, Keys: []agent.U32Key{{Mask: 0xffffffff, Val: 0xc6121000 + h, Off: 16}}}
		if err := k.ReplaceFilter(dev, old); err != nil {
			t.Fatal(err)
		}
	}
	f := agent.Filter{Handle: 1, ClassID: class.ID, AnyEtherType: true, Keys: []agent.U32Key{
		{Mask: 0xffff, Val: 0x0800, Off: -4}, {Mask: 0xffffffff, Val: 0xc6121001, Off: 16}, {Mask: 0xffff, Val: 2049, Off: 20}}}
	if err := k.ReplaceFilter(dev, f); err == nil {
		t.Fatal("a filter of protocol all beside filters of protocol ip at one priority: no error")
	}
	ch, err := agent.Reconcile(k, dev, 10, []agent.HTBClass{class}, []agent.Filter{f}, nil)
	if err != nil || ch.FiltersDeleted != 2 || ch.FiltersSet != 1 {
		t.Fatalf("reconcile over two protocol-ip filters: %v, %v; want 2 deleted, 1 set", ch, err)
	}
	got, err := k.Filters(dev)
	if err != nil || len(got) != 1 || !got[0].AnyEtherType || fmt.Sprint(got[0].Keys) != fmt.Sprint(f.Keys) {
		t.Fatalf("filters read back: %+v, %v; want %+v", got, err, f)
	}
	if ch, err := agent.Reconcile(k, dev, 10, []agent.HTBClass{class}, []agent.Filter{f}, nil); err != nil || ch.FiltersSet+ch.FiltersDeleted != 0 {
		t.Errorf("second reconcile: %v, %v; want no filter written", ch, err)
	}
}
