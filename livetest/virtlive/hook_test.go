package virtlive

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/agent"
	"sluice/livetest/livelab"
	"sluice/virt"
)

// TestHookAndAgent runs sluice on this host as an operator would, with the
// real libvirtd: `sluice hook install` (libvirt's qemu hook), and `sluice
// agent --inventory libvirt` shaping a veth on a test bridge as the
// host's uplink. A TCG guest whose 600 Mbps reservation fits starts and
// is enforced within 2 s of its start event (its HTB class on the uplink,
// sluice's classifier on its tap); a second one whose 300 Mbps no longer
// fits (75% of 1 Gbps) is refused by the hook, does not start, and
// libvirt's error carries sluice's reason; the first one's class is
// removed within 2 s of its destroy. Then the agent is stopped, `sluice
// agent uninstall` gives the uplink its root qdisc back and `sluice hook
// uninstall` removes the hook.
//
// While it runs the hook is installed for every domain of this machine:
// domains the test's policy does not name are admitted as before.
func TestHookAndAgent(t *testing.T) {
	preflight(t)
	ctl, err := virt.Dial("")
	if err != nil {
		t.Fatalf("%v (is libvirtd running? scripts/deps.sh starts it)", err)
	}
	t.Cleanup(func() { ctl.Close() })
	c := ctl.Client()
	sweep(t, c)

	id := randHex(2)
	bridge, up, peer := "sl-vlbr"+id, "sl-vlu"+id, "sl-vlp"+id
	domA, domB := "sl-virtlive-"+id+"-a", "sl-virtlive-"+id+"-b"
	dir, err := os.MkdirTemp("", "sl-virtlive-"+id+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kernel, modDir := guestKernel(t)
	initrd := filepath.Join(dir, "initrd")
	if err := writeInitramfs(initrd, modDir); err != nil {
		t.Fatalf("guest initramfs: %v", err)
	}
	run(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	run(t, "ip", "link", "add", up, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "del", up).Run() })
	run(t, "ip", "link", "set", up, "master", bridge)
	for _, d := range []string{bridge, up, peer} {
		run(t, "ip", "link", "set", d, "up")
	}
	before := tcOut(t, "-j", "qdisc", "show", "dev", up)

	sluice := livelab.MustSluiceBinary(t)
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(fmt.Sprintf(`cluster: vl%s
reservationCap: 0.75
hosts: [{name: h1, cpu: {cores: 2, mhz: 2000}, memory: 4GiB, uplinks: [{name: up0, speed: 1Gbps}]}]
vms:
  - {name: %s, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 600Mbps}]}
  - {name: %s, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 300Mbps}]}
`, id, domA, domB)), 0o644); err != nil {
		t.Fatal(err)
	}
	sl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(sluice, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("sluice %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	// The hook.
	state := filepath.Join(dir, "state")
	t.Logf("%s", strings.TrimSpace(sl("hook", "install", "--policy", pol, "--host", "h1", "--agent", agent.AdmitSocket(state, "h1"))))
	t.Cleanup(func() {
		out, err := exec.Command(sluice, "hook", "uninstall").CombinedOutput()
		if err != nil {
			t.Errorf("hook uninstall: %v: %s", err, out)
		}
		t.Logf("%s", strings.TrimSpace(string(out)))
	})
	time.Sleep(500 * time.Millisecond) // libvirtd reloads on SIGHUP

	// The agent, on the root namespace with the libvirt inventory.
	agent := exec.Command(sluice, "agent", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", pol, "--host", "h1", "--state-dir", state)
	agentLog, _ := os.Create(filepath.Join(dir, "agent.log"))
	agent.Stdout, agent.Stderr = agentLog, agentLog
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	stopAgent := func() {
		if agent.Process != nil && agent.ProcessState == nil {
			agent.Process.Signal(syscall.SIGTERM)
			agent.Wait()
		}
	}
	t.Cleanup(func() {
		stopAgent()
		b, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
		t.Logf("agent log:\n%s", b)
	})
	waitFor(t, "the agent's HTB on "+up, 10*time.Second, func() bool {
		return strings.Contains(tcOut(t, "qdisc", "show", "dev", up), "htb 1:")
	})

	destroy := func(name string) {
		if d, err := c.DomainLookupByName(name); err == nil {
			c.DomainDestroy(d)
		}
	}
	t.Cleanup(func() { destroy(domA); destroy(domB) })
	mac := func(k string) string { return "52:54:00:5f:" + id[:2] + ":" + k }

	// A fits: it starts, and is enforced within 2 s.
	t0 := time.Now()
	dom, err := c.DomainCreateXML(domainXML(domA, kernel, initrd, bridge, mac("0a"), filepath.Join(dir, "a.log")), 0)
	if err != nil {
		t.Fatalf("domain %s (600 Mbps, fits) did not start: %v", domA, err)
	}
	started := time.Now()
	tap := tapOf(t, c, dom)
	// The class follows the vNIC's index, which the inventory gives over
	// every domain of the machine: it is read from the agent's status.
	var classID string
	class := waitFor(t, "the class of "+domA, 5*time.Second, func() bool {
		classID, _ = statusClass(state, "vl"+id, domA+"/nic0")
		return classID != "" && strings.Contains(tcOut(t, "class", "show", "dev", up), "htb "+classID+" parent 1:") &&
			strings.Contains(tcOut(t, "filter", "show", "dev", tap, "ingress"), "sluice-prio")
	})
	t.Logf("%s started (create took %v); its class %s on %s and the classifier on its tap %s %v after the start",
		domA, started.Sub(t0).Round(time.Millisecond), classID, up, tap, class.Sub(started).Round(time.Millisecond))
	if d := class.Sub(started); d > 2*time.Second {
		t.Errorf("%s enforced %v after its start, want ≤ 2 s", domA, d)
	}

	// B does not fit next to A: the hook refuses it.
	_, err = c.DomainCreateXML(domainXML(domB, kernel, initrd, bridge, mac("0b"), filepath.Join(dir, "b.log")), 0)
	if err == nil {
		t.Fatalf("domain %s (300 Mbps next to 600 of 750) started; want the hook to refuse it", domB)
	}
	t.Logf("libvirt refused %s: %v", domB, err)
	if !strings.Contains(err.Error(), "sluice: refused "+domB) || !strings.Contains(err.Error(), "free 150Mbps (short 150Mbps") {
		t.Errorf("libvirt's error does not carry sluice's reason: %v", err)
	}
	if d, err := c.DomainLookupByName(domB); err == nil {
		if st, _, _ := c.DomainGetState(d, 0); libvirt.DomainState(st) == libvirt.DomainRunning {
			t.Errorf("%s runs after the refusal", domB)
		}
	}

	// A goes: its class goes within 2 s.
	if err := c.DomainDestroy(dom); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	gone := waitFor(t, "the class of "+domA+" removed", 5*time.Second, func() bool {
		return !strings.Contains(tcOut(t, "class", "show", "dev", up), "htb "+classID+" ")
	})
	t.Logf("%s destroyed; its class removed %v later", domA, gone.Sub(stopped).Round(time.Millisecond))
	if d := gone.Sub(stopped); d > 2*time.Second {
		t.Errorf("class removed %v after the destroy, want ≤ 2 s", d)
	}

	// Now B fits: the hook admits it.
	dom, err = c.DomainCreateXML(domainXML(domB, kernel, initrd, bridge, mac("0b"), filepath.Join(dir, "b.log")), 0)
	if err != nil {
		t.Fatalf("domain %s, alone, did not start: %v", domB, err)
	}
	c.DomainDestroy(dom)

	stopAgent()
	t.Logf("%s", strings.TrimSpace(sl("agent", "uninstall", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", pol, "--host", "h1", "--state-dir", state)))
	if after := tcOut(t, "-j", "qdisc", "show", "dev", up); after != before {
		t.Errorf("uninstall: qdiscs of %s\nbefore %s\nafter  %s", up, before, after)
	}
}

// statusClass reads the class id and HTB ceil of port from the agent's
// statistics file ("" while the agent has none for it).
func statusClass(stateDir, cluster, port string) (string, int64) {
	s, err := agent.ReadStats(stateDir, cluster, "h1")
	if err != nil {
		return "", 0
	}
	for _, u := range s.Uplinks {
		for _, ps := range u.Ports {
			if ps.Port == port {
				return ps.ClassID, ps.CeilBps
			}
		}
	}
	return "", 0
}

func tcOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("tc", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("tc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// waitFor polls cond every 20 ms and returns when it first held.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Now()
}

// tapOf returns the host-side device of the domain's interface.
func tapOf(t *testing.T, c *libvirt.Libvirt, d libvirt.Domain) string {
	t.Helper()
	x, err := c.DomainGetXMLDesc(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	dm, err := virt.ParseDomainXML([]byte(x))
	if err != nil || len(dm.Interfaces) == 0 || dm.Interfaces[0].Dev == "" {
		t.Fatalf("domain XML: %v %+v", err, dm)
	}
	return dm.Interfaces[0].Dev
}
