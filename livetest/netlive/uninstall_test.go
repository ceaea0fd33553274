package netlive

import (
	"os/exec"
	"strings"
	"testing"

	"sluice/agent"
)

// TestUninstallGivesBack: an agent records the uplink's root qdisc before
// it replaces it; Uninstall restores it as `tc -j qdisc show` saw it before
// (a kernel default, noqueue on a veth, and a root set by hand, tbf), and
// leaves no sluice filter, eBPF program or clsact on the uplink and the
// vNICs; a second Uninstall changes nothing.
func TestUninstallGivesBack(t *testing.T) {
	l := upLab(t, strings.ReplaceAll(smallPolicy, "cluster: nlc", "cluster: nun"))
	ns := l.plan.Host("h1").Name
	tc := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "tc"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tc %v: %v %s", args, err, out)
		}
		return string(out)
	}
	devs := []string{"sl-up0", l.plan.NIC("vm1/nic0").HostDev}
	show := func() string {
		var b strings.Builder
		for _, d := range devs {
			b.WriteString(tc("-j", "qdisc", "show", "dev", d))
			b.WriteString(tc("filter", "show", "dev", d, "ingress"))
		}
		return b.String()
	}
	for _, setup := range [][]string{nil, {"qdisc", "replace", "dev", "sl-up0", "root", "handle", "8001:", "tbf", "rate", "500mbit", "burst", "256k", "latency", "20ms"}} {
		if setup != nil {
			tc(setup...)
		}
		before := show()
		record := t.TempDir() + "/state.json"
		k, err := agent.NewNetlinkKernel(ns)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := l.plan.Inventory("h1")
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{Policy: l.p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true, RecordPath: record})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Step(agent.NowNs()); err != nil {
			t.Fatal(err)
		}
		installed := show()
		if !strings.Contains(installed, `"kind":"htb"`) || !strings.Contains(installed, "sluice-prio-1:100") {
			t.Fatalf("the agent did not install its tree and classifier:\n%s", installed)
		}
		rec, err := agent.ReadRecord(record)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			done, err := agent.Uninstall(k, rec, []string{"sl-up0"}, devs[1:])
			if err != nil {
				t.Fatalf("uninstall %d: %v", i+1, err)
			}
			t.Logf("uninstall %d (%s root): %s", i+1, rec.Uplinks["sl-up0"].Kind, strings.Join(done, "; "))
			if i == 1 && len(done) != 0 {
				t.Errorf("a second uninstall did %v", done)
			}
			if after := show(); after != before {
				t.Errorf("after uninstall %d:\n%s\nbefore install:\n%s", i+1, after, before)
			}
		}
		k.Close()
	}
}
