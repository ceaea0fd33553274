package netlive

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"sluice/agent"
)

// TestUninstallGivesBack: an agent records the uplink's root qdisc before
// it replaces it, in its state file and in the roots directory; without
// either Uninstall is an error and changes nothing; with either it
// restores the root as `tc -j qdisc show` saw it before (a kernel default,
// noqueue on a veth, and roots set by hand: tbf, and tbf with a peak rate
// and an mtu, as on the host of issue 25), and
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
	for _, setup := range [][]string{nil, {"qdisc", "replace", "dev", "sl-up0", "root", "handle", "8001:", "tbf", "rate", "500mbit", "burst", "256k", "latency", "20ms"},
		{"qdisc", "replace", "dev", "sl-up0", "root", "handle", "5:", "tbf", "rate", "750mbit", "burst", "96kb", "peakrate", "900mbit", "mtu", "3000", "latency", "33ms"}} {
		if setup != nil {
			tc(setup...)
		}
		before := show()
		record := t.TempDir() + "/state.json"
		roots := t.TempDir()
		_, k := l.installAgent("h1", record, roots)
		installed := show()
		if !strings.Contains(installed, `"kind":"htb"`) || !strings.Contains(installed, "sluice-prio-1:100") {
			t.Fatalf("the agent did not install its tree and classifier:\n%s", installed)
		}
		rec, err := agent.ReadRecord(record)
		if err != nil {
			t.Fatal(err)
		}
		// Without the state file nor the roots directory: an error, and
		// sluice's tree stays.
		if _, err := agent.Uninstall(k, nil, agent.UninstallOptions{}, []string{"sl-up0"}, nil); !errors.Is(err, agent.ErrRootUnknown) {
			t.Errorf("uninstall without any record: %v, want %v", err, agent.ErrRootUnknown)
		}
		if q, _ := k.RootQdisc("sl-up0"); !q.IsSluice() {
			t.Errorf("uninstall without any record replaced sluice's root by %s", q.Kind)
		}
		for i := 0; i < 2; i++ {
			// The first time without the state file: the root comes
			// from the roots directory, as for an agent that ran with
			// another --state-dir.
			use := rec
			if i == 0 && setup != nil {
				use = nil
			}
			done, err := agent.Uninstall(k, use, agent.UninstallOptions{RootsDir: roots}, []string{"sl-up0"}, devs[1:])
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
