package netlive

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/agent"
	"sluice/lab"
)

const smallPolicy = `cluster: nlc
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}]
trafficClasses:
  vm: {shares: normal}
  nfs: {shares: normal}
datastores:
  - {name: ds1, array: {slots: 2, serviceTime: 1ms}}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0, reservation: 100Mbps}], disks: [{name: d0, datastore: ds1, size: 16MiB}]}
  - {name: vm2, host: h2, nics: [{name: nic0}]}
`

// TestLabLifecycle: up builds every namespace with its role and address and
// the servers; VMs reach the fabric through their host; a second up is
// refused; down removes everything, also from the prefix alone when the
// state file is lost (as after a crash).
func TestLabLifecycle(t *testing.T) {
	l := upLab(t, smallPolicy)
	s, err := lab.GetStatus("nlc", l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, ns := range s.Namespaces {
		if !ns.Exists {
			t.Errorf("namespace %s does not exist", ns.Name)
		}
		roles[ns.Name] = ns.Role
		if ns.Role == lab.RoleVM && ns.Entity == "vm1" {
			if len(ns.Disks) != 1 || ns.Disks[0].URI != "nbd+unix:///vm1/d0?socket=/run/sluice/gw-nlc-h1/vm1.sock" {
				t.Errorf("vm1 disks: %+v", ns.Disks)
			}
		}
	}
	want := map[string]string{"sl-nlc-fabric": "fabric", "sl-nlc-h1": "host", "sl-nlc-h2": "host",
		"sl-nlc-vm1": "vm", "sl-nlc-vm2": "vm", "sl-nlc-ds1": "datastore"}
	for n, r := range want {
		if roles[n] != r {
			t.Errorf("namespace %s: role %q, want %q", n, roles[n], r)
		}
	}
	if b, _ := json.Marshal(s); !strings.Contains(string(b), `"role":"datastore"`) {
		t.Errorf("status JSON lacks roles: %s", b)
	}
	for _, pr := range s.Processes {
		if !pr.Running {
			t.Errorf("process %s (pid %d) is not running", pr.Name, pr.PID)
		}
	}
	// VM → host bridge → uplink → fabric.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port := strconv.Itoa(l.plan.NIC("vm2/nic0").IperfPort)
	if out, err := lab.Exec(ctx, "sl-nlc-vm2", "iperf3", "-c", lab.FabricIP.String(), "-p", port, "-n", "1M"); err != nil {
		t.Errorf("vm2 cannot reach the fabric: %v %s", err, out)
	}
	if _, err := lab.Up(l.p, lab.Options{StateDir: l.stateDir}); err == nil || !strings.Contains(err.Error(), "already up") {
		t.Errorf("second up: %v, want 'already up'", err)
	}
	// A crash: the state file is gone; down works from the prefix.
	var pids []string
	for _, ns := range lab.Existing("nlc") {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		pids = append(pids, strings.Fields(string(out))...)
	}
	if len(pids) == 0 {
		t.Fatal("no processes in the lab's namespaces")
	}
	if err := os.Remove(lab.StatePath(l.stateDir, "nlc")); err != nil {
		t.Fatal(err)
	}
	if err := lab.Down("nlc", l.stateDir); err != nil {
		t.Fatalf("down without state file: %v", err)
	}
	if left := lab.Existing("nlc"); len(left) != 0 {
		t.Errorf("namespaces left: %v", left)
	}
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + pid); err == nil {
			if b, _ := os.ReadFile("/proc/" + pid + "/stat"); !strings.Contains(string(b), ") Z") {
				t.Errorf("process %s survived down", pid)
			}
		}
	}
}

// TestReconcileIdempotent applies the tree of a host through netlink in its
// real namespace twice: the second time changes nothing. A new agent adds
// only the classifier at the vNIC; a restarted one changes nothing on its
// first step.
func TestReconcileIdempotent(t *testing.T) {
	l := upLab(t, strings.ReplaceAll(smallPolicy, "cluster: nlc", "cluster: nid"))
	k, err := agent.NewNetlinkKernel("sl-nid-h1")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, dynamic := range []bool{false, true} {
		inv, err := l.plan.Inventory("h1")
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{Policy: l.p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: dynamic})
		if err != nil {
			t.Fatal(err)
		}
		tr := a.Trees()[0]
		want := tr.HTBClasses(nil)
		ch1, err := agent.Reconcile(k, tr.Dev, tr.Default, want, tr.Filters, nil)
		if err != nil {
			t.Fatalf("first apply: %v", err)
		}
		ch2, err := agent.Reconcile(k, tr.Dev, tr.Default, want, tr.Filters, nil)
		if err != nil {
			t.Fatalf("second apply: %v", err)
		}
		t.Logf("dynamic=%v: first apply %s; second %s", dynamic, ch1, ch2)
		if ch2.Total() != 0 {
			t.Errorf("second apply changed %s", ch2)
		}
		ch3, err := a.Step(agent.NowNs())
		if err != nil {
			t.Fatal(err)
		}
		// Reconcile above set the uplink only: the first agent attaches the
		// classifier at vm1's vNIC; after that nothing changes.
		if vn := ch3.VNICsSet; ch3.Total() != vn || (!dynamic && vn != 1) || (dynamic && vn != 0) {
			t.Errorf("a new agent's first step (dynamic=%v) changed %s", dynamic, ch3)
		}
	}
	out, err := exec.Command("ip", "netns", "exec", "sl-nid-h1", "tc", "filter", "show", "dev", "sl-v0n0", "ingress").Output()
	if err != nil || !strings.Contains(string(out), "sluice-prio-1:100") || !strings.Contains(string(out), "direct-action") {
		t.Errorf("tc shows no classifier at vm1's vNIC: %v\n%s", err, out)
	}
	out, err = exec.Command("ip", "netns", "exec", "sl-nid-h1", "tc", "class", "show", "dev", "sl-up0").Output()
	if err != nil || !strings.Contains(string(out), "htb 1:100") {
		t.Errorf("tc shows no vNIC class: %v\n%s", err, out)
	}
}
