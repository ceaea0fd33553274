package virtlive

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/admit"
	"sluice/agent"
	"sluice/controller"
	"sluice/cpuctl"
	"sluice/livetest/livelab"
	"sluice/virt"
)

// TestClusterAsItIs runs the controller and a real `sluice agent
// --controller --inventory libvirt --cpu` on this machine's libvirtd, as an
// operator would, and starts and stops domains behind sluice's back:
//
//   - the agent starts while a VM the policy places on its host is
//     defined but shut off, stays up and enforces the VM that runs;
//   - `virsh start` of the shut-off VM: the controller sees it running
//     within 1 s, the agent classes it within 2 s;
//   - a VM powered on with ctl that needs that VM's room is refused; after
//     `virsh destroy` the controller sees it off within 1 s and the same
//     power-on succeeds;
//   - a domain the policy does not name, started with virsh, is reported
//     and classed as the policy's unnamedVMs setting says;
//   - the hook (asking the agent) refuses a domain whose reservation fits
//     the policy file but not the controller's state after a ctl set, with
//     the reason, and the domain does not start;
//   - ctl set of a vNIC's reservation, shares and limit, and of a VM's CPU
//     reservation, shares, limit, memory and vCPUs reaches the host within
//     1 s: read back from tc, the agent's status and the cgroup's files.
func TestClusterAsItIs(t *testing.T) {
	preflight(t)
	tree, err := cpuctl.Detect("")
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	lv, err := virt.Dial("")
	if err != nil {
		t.Fatalf("%v (is libvirtd running? scripts/deps.sh starts it)", err)
	}
	t.Cleanup(func() { lv.Close() })
	c := lv.Client()
	sweep(t, c)
	machine := livelab.WatchMachine(t)

	id := randHex(2)
	bridge, up, peer := "sl-vlbr"+id, "sl-vlu"+id, "sl-vlp"+id
	dom := func(k string) string { return "sl-virtlive-" + id + "-" + k }
	dir, err := os.MkdirTemp("", "sl-virtlive-"+id+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
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
	destroy := func(name string) {
		if d, err := c.DomainLookupByName(name); err == nil {
			c.DomainDestroy(d)
			c.DomainUndefine(d)
		}
	}
	t.Cleanup(func() {
		for _, k := range []string{"a", "b", "c", "d", "x"} {
			destroy(dom(k))
		}
	})
	mac := func(k string) string { return fmt.Sprintf("52:54:00:6e:%s:%02x", id[:2], k[0]) }
	xml := func(k string) string {
		return domainXML(dom(k), kernel, initrd, bridge, mac(k), filepath.Join(dir, k+".log"))
	}
	sluice := livelab.MustSluiceBinary(t)

	// The policy: a (400 Mbps) and b (200) placed on h1, c (500) and d
	// (50 in the file) off; h1 reserves at most 750 Mbps for vNICs.
	cluster := "vo" + id
	doc := fmt.Sprintf(`cluster: %s
reservationCap: 0.75
unnamedVMs: {reservation: 50Mbps}
hosts:
  - {name: h1, cpu: {cores: 2, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, cpu: {cores: 2, mhz: 2000}, memory: 8GiB, uplinks: [{name: up0, speed: 1Gbps}]}
vms:
  - {name: %s, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 400Mbps}]}
  - {name: %s, host: h1, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 200Mbps}]}
  - {name: %s, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 500Mbps}]}
  - {name: %s, cpu: {vcpus: 1}, memory: 256MiB, nics: [{name: nic0, reservation: 50Mbps}]}
`, cluster, dom("a"), dom("b"), dom("c"), dom("d"))
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}

	// b runs; a is defined and shut off.
	if _, err := c.DomainCreateXML(xml("b"), 0); err != nil {
		t.Fatalf("domain %s: %v", dom("b"), err)
	}
	if _, err := c.DomainDefineXML(xml("a")); err != nil {
		t.Fatalf("define %s: %v", dom("a"), err)
	}

	// The controller, the policy, the hook (asking the agent), the agent.
	data := filepath.Join(dir, "data")
	port := livelab.FreePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	startDaemon(t, dir, "controller", sluice, "controller", "--data-dir", data, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--host-ttl", "6")
	ctl := func(args ...string) (string, error) {
		out, err := exec.Command(sluice, append([]string{"ctl", "--server", server, "--data-dir", data}, args...)...).CombinedOutput()
		return string(out), err
	}
	waitFor(t, "the controller's API", 30*time.Second, func() bool { _, err := ctl("get", "hosts"); return err == nil })
	if out, err := ctl("apply", "-f", pol); err != nil {
		t.Fatalf("ctl apply: %v: %s", err, out)
	}
	tok, err := controller.ReadToken(filepath.Join(data, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := controller.NewClient(server, tok, filepath.Join(data, "tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	state := filepath.Join(dir, "state")
	sock := agent.AdmitSocket(state, "h1")
	out, err := exec.Command(sluice, "hook", "install", "--host", "h1", "--policy", pol, "--agent", sock).CombinedOutput()
	if err != nil {
		t.Fatalf("hook install: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command(sluice, "hook", "uninstall").Run() })
	agentProc := startDaemon(t, dir, "agent", sluice, "agent", "--host", "h1", "--controller", server, "--token-file", filepath.Join(data, "token"),
		"--ca", filepath.Join(data, "tls", "cert.pem"), "--inventory", "libvirt", "--uplink", "up0="+up, "--state-dir", state, "--cpu")
	t.Cleanup(func() {
		exec.Command(sluice, "agent", "uninstall", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", pol, "--host", "h1", "--state-dir", state).Run()
	})
	vm := func(name string) controller.VMInfo {
		vs, err := cl.VMs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if v.Name == name {
				return v
			}
		}
		t.Fatalf("no VM %s", name)
		return controller.VMInfo{}
	}
	classOf := func(port string) string { id, _ := statusClass(state, cluster, port); return id }
	waitFor(t, "the agent registered and "+dom("b")+" classed", 20*time.Second, func() bool {
		return vm(dom("b")).State == "running" && classOf(dom("b")+"/nic0") != ""
	})
	if e := agentProc.exited(); e != "" {
		t.Fatalf("the agent exited with %s shut off on its host: %s", dom("a"), e)
	}
	t.Logf("the agent runs with %s shut off (%s) and enforces %s (class %s)", dom("a"), vm(dom("a")).State, dom("b"), classOf(dom("b")+"/nic0"))

	// virsh start of a: reported within 1 s, classed within 2 s.
	da, err := c.DomainLookupByName(dom("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DomainCreate(da); err != nil {
		t.Fatalf("start %s: %v", dom("a"), err)
	}
	started := time.Now()
	seen := waitFor(t, dom("a")+" running in the controller", 10*time.Second, func() bool { return vm(dom("a")).Observed == "h1" })
	classed := waitFor(t, dom("a")+" classed", 10*time.Second, func() bool { return classOf(dom("a")+"/nic0") != "" })
	t.Logf("%s started: running in the controller %v later, its class %v later (%s)", dom("a"), seen.Sub(started).Round(time.Millisecond),
		classed.Sub(started).Round(time.Millisecond), machine.Between(started, classed))
	if d := seen.Sub(started); d > time.Second {
		t.Errorf("%s reported running %v after its start, want ≤ 1 s (%s)", dom("a"), d.Round(time.Millisecond), machine.Between(started, seen))
	}
	if d := classed.Sub(started); d > 2*time.Second {
		t.Errorf("%s classed %v after its start, want ≤ 2 s (%s)", dom("a"), d.Round(time.Millisecond), machine.Between(started, classed))
	}

	// c (500) does not fit next to a (400) and b (200).
	if out, err := ctl("power-on", dom("c"), "--on", "h1"); err == nil || !strings.Contains(out, "refused") {
		t.Fatalf("power-on %s next to a and b: %v %s; want refused", dom("c"), err, out)
	}
	// virsh destroy of a: off within 1 s, and then c fits.
	if err := c.DomainDestroy(da); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	off := waitFor(t, dom("a")+" off in the controller", 10*time.Second, func() bool { return vm(dom("a")).State == "off" })
	t.Logf("%s destroyed: off in the controller %v later", dom("a"), off.Sub(stopped).Round(time.Millisecond))
	if d := off.Sub(stopped); d > time.Second {
		t.Errorf("%s off %v after its destroy, want ≤ 1 s (%s)", dom("a"), d.Round(time.Millisecond), machine.Between(stopped, off))
	}
	if out, err := ctl("power-on", dom("c"), "--on", "h1"); err != nil {
		t.Fatalf("power-on %s after %s's destroy: %v %s", dom("c"), dom("a"), err, out)
	}

	// A domain the policy does not name: reported, classed as unnamed.
	if _, err := c.DomainCreateXML(xml("x"), 0); err != nil {
		t.Fatalf("domain %s: %v", dom("x"), err)
	}
	xs := time.Now()
	waitFor(t, dom("x")+" reported", 10*time.Second, func() bool {
		hs, err := cl.Hosts(ctx)
		return err == nil && len(hs) > 0 && hs[0].Report != nil && contains(hs[0].Report.Unnamed, dom("x"))
	})
	waitFor(t, dom("x")+" classed as unnamed", 10*time.Second, func() bool { return classOf(dom("x")+"/nic0") != "" })
	t.Logf("%s (not in the policy) reported and classed %v after its start", dom("x"), time.Since(xs).Round(time.Millisecond))
	destroy(dom("x"))

	// The hook asks the agent: d's 50 Mbps fit next to b (200) and c
	// (500, starting) by the file, not the 100 the controller now says.
	if out, err := ctl("set", dom("d")+"/nic0", "reservation=100Mbps"); err != nil {
		t.Fatalf("ctl set: %v %s", err, out)
	}
	waitFor(t, "the agent's admission with the new reservation", 5*time.Second, func() bool {
		d, err := agent.AskAdmit(ctx, sock, admitDomain(dom("d")))
		return err == nil && !d.Allow
	})
	_, err = c.DomainCreateXML(xml("d"), 0)
	if err == nil {
		t.Fatalf("%s (100 Mbps in the controller, 50 in the file, next to 700 of 750) started; want the hook to refuse it", dom("d"))
	}
	t.Logf("libvirt refused %s: %v", dom("d"), err)
	if !strings.Contains(err.Error(), "sluice: refused "+dom("d")) || !strings.Contains(err.Error(), "needs 100Mbps") {
		t.Errorf("libvirt's error does not carry the agent's reason: %v", err)
	}
	if d, err := c.DomainLookupByName(dom("d")); err == nil {
		if st, _, _ := c.DomainGetState(d, 0); libvirt.DomainState(st) == libvirt.DomainRunning {
			t.Errorf("%s runs after the refusal", dom("d"))
		}
	}

	// Each field of ctl set reaches the host within 1 s.
	b := dom("b")
	cpuOf := func() agent.CPUStat {
		s, err := agent.ReadStats(state, cluster, "h1")
		if err == nil {
			for _, c := range s.CPU {
				if c.VM == b {
					return c
				}
			}
		}
		return agent.CPUStat{}
	}
	group := cpuOf().Cgroup
	if group == "" {
		t.Fatalf("the agent has no cgroup for %s (--cpu): %+v", b, cpuOf())
	}
	cgFile := func(name string) string {
		v, _ := os.ReadFile(filepath.Join(tree.Dir(group), name))
		return strings.TrimSpace(string(v))
	}
	for _, f := range []struct {
		set  string
		what string
		ok   func() bool
	}{
		// Dynamic HTB rates follow demand (b sends nothing: its class
		// has its floor rate): the reservation in force is the agent's.
		{b + "/nic0 reservation=300Mbps", "reservation 300 Mbps in force, its class in tc", func() bool {
			p := portOf(state, cluster, b+"/nic0")
			rate, _ := tcRates(classLine(t, up, p.ClassID))
			return p.ReservationBps == 300e6 && rate > 0
		}},
		{b + "/nic0 limit=600Mbps", "limit 600 Mbps, tc ceil its wire rate", func() bool {
			p := portOf(state, cluster, b+"/nic0")
			_, ceil := tcRates(classLine(t, up, p.ClassID))
			return p.LimitBps == 600e6 && ceil >= 600e6 && math.Abs(ceil-float64(p.CeilBps)) <= 0.01*ceil
		}},
		{b + "/nic0 shares=high", "shares 100 at the agent", func() bool { return portOf(state, cluster, b+"/nic0").Shares == 100 }},
		{b + " cpu.reservation=500MHz", "reservation 500 MHz in force, entitlement ≥ it", func() bool {
			c := cpuOf()
			return c.ReservationMHz == 500 && c.EntitlementMHz >= 500
		}},
		{b + " cpu.shares=high", "shares 2000 in force, the cgroup's cpu.shares as derived", func() bool {
			c := cpuOf()
			return c.SharesSetting == 2000 && cgFile("cpu.shares") == strconv.Itoa(c.Shares)
		}},
		{b + " cpu.limit=1000MHz", "limit 1000 MHz in force, the cgroup's cfs quota half a 2000 MHz core", func() bool {
			return cpuOf().LimitMHz == 1000 && cgFile("cpu.cfs_quota_us") == "50000"
		}},
		{b + " memory=512MiB", "memory 512 MiB at the agent", func() bool { return cpuOf().MemoryBytes == 512<<20 }},
		{b + " vcpus=2", "2 vCPUs at the agent", func() bool { return cpuOf().VCPUs == 2 }},
	} {
		target, field, _ := strings.Cut(f.set, " ")
		t0 := time.Now()
		if out, err := ctl("set", target, field); err != nil {
			t.Fatalf("ctl set %s: %v %s", f.set, err, out)
		}
		var at time.Time
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if f.ok() {
				at = time.Now()
				break
			}
			if time.Now().After(deadline) {
				p := portOf(state, cluster, b+"/nic0")
				t.Fatalf("ctl set %s: not on the host (%s) within 10 s: the agent has %+v, tc %q, CPU %+v", f.set, f.what, p, classLine(t, up, p.ClassID), cpuOf())
			}
		}
		t.Logf("ctl set %s: on the host (%s) %v later", f.set, f.what, at.Sub(t0).Round(time.Millisecond))
		if d := at.Sub(t0); d > time.Second {
			t.Errorf("ctl set %s reached the host %v after it, want ≤ 1 s (%s)", f.set, d.Round(time.Millisecond), machine.Between(t0, at))
		}
	}
	if e := agentProc.exited(); e != "" {
		t.Errorf("the agent exited: %s", e)
	}
}

// admitDomain is a domain of one vNIC as the hook sends it.
func admitDomain(name string) admit.Domain { return admit.Domain{Name: name, VNICs: 1} }

// classLine is tc's line of class id on dev ("" when none).
func classLine(t *testing.T, dev, id string) string {
	if id == "" {
		return ""
	}
	for _, l := range strings.Split(tcOut(t, "class", "show", "dev", dev), "\n") {
		if strings.HasPrefix(l, "class htb "+id+" ") {
			return l
		}
	}
	return ""
}

// portOf is port's entry in the agent's status (zero when none).
func portOf(stateDir, cluster, port string) agent.PortStat {
	s, err := agent.ReadStats(stateDir, cluster, "h1")
	if err != nil {
		return agent.PortStat{}
	}
	for _, u := range s.Uplinks {
		for _, p := range u.Ports {
			if p.Port == port {
				return p
			}
		}
	}
	return agent.PortStat{}
}

// tcRates reads the rate and ceil (bits/s) of a tc class line.
func tcRates(line string) (rate, ceil float64) {
	f := strings.Fields(line)
	val := func(s string) float64 {
		for _, u := range []struct {
			suffix string
			mult   float64
		}{{"Gbit", 1e9}, {"Mbit", 1e6}, {"Kbit", 1e3}, {"bit", 1}} {
			if v, ok := strings.CutSuffix(s, u.suffix); ok {
				x, _ := strconv.ParseFloat(v, 64)
				return x * u.mult
			}
		}
		return 0
	}
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "rate":
			rate = val(f[i+1])
		case "ceil":
			ceil = val(f[i+1])
		}
	}
	return rate, ceil
}

// daemon is a process the test started.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// exited says how the daemon ended ("" while it runs).
func (d *daemon) exited() string {
	select {
	case <-d.done:
		return d.cmd.ProcessState.String()
	default:
		return ""
	}
}

// startDaemon runs args with its output in dir/NAME.log, stopped at
// cleanup (SIGTERM), its log in the test's log when it failed.
func startDaemon(t *testing.T, dir, name string, args ...string) *daemon {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-d.done
		}
		logf.Close()
		if t.Failed() {
			f, _ := os.Open(logf.Name())
			defer f.Close()
			sc := bufio.NewScanner(f)
			var lines []string
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			t.Logf("%s's log (last lines):\n%s", name, strings.Join(lines, "\n"))
		}
	})
	return d
}
