package virtlive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/agent"
	"sluice/entitle"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
	"sluice/virt"
)

// TestDomainsStartedAfterAgent runs `sluice agent --inventory libvirt` on
// a veth of a test bridge as the host's uplink (300 Mbps) before any guest
// runs, then starts two TCG guests under the real libvirtd on that bridge:
// A, which the policy names (limit 100 Mbps), and B, which it does not
// (the policy's unnamedVMs: limit 50 Mbps per vNIC). For each it checks,
// through libvirt's lifecycle events and the agent alone:
//
//   - enforced within 2 s of its start: its HTB class on the uplink with
//     its ceil, and sluice's classifier on its tap;
//   - the agent's status lists B as unnamed, with its port B/nic0;
//   - both guests sending at once (iperf3 in the guest, -R from a
//     namespace behind the uplink), each one's received rate, after a
//     4 s warm-up, is within 5% of its entitlement (entitle.NetworkWith
//     with B unnamed: each is held by its limit), over the seconds in
//     which both classes were backlogged (as TestLabGuests judges them:
//     else a guest was short of CPU), measured again when fewer than
//     half the seconds count;
//   - destroyed, its class is removed within 2 s.
//
// Then `sluice agent uninstall` gives the uplink its root qdisc back.
func TestDomainsStartedAfterAgent(t *testing.T) {
	preflight(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not found: run scripts/deps.sh")
	}
	ctl, err := virt.Dial("")
	if err != nil {
		t.Fatalf("%v (is libvirtd running? scripts/deps.sh starts it)", err)
	}
	t.Cleanup(func() { ctl.Close() })
	c := ctl.Client()
	sweep(t, c)

	id := randHex(2)
	bridge, up, peer, ns := "sl-vlbr"+id, "sl-vlu"+id, "sl-vlp"+id, "sl-virtlive-"+id
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
	// bridge: the guests' taps and the uplink veth; the veth's peer in a
	// namespace of its own, where the receivers run.
	b, _ := strconv.ParseUint(id[:2], 16, 8)
	subnet := fmt.Sprintf("10.213.%d.", b)
	run(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", up, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "del", up).Run() })
	run(t, "ip", "link", "set", up, "master", bridge)
	run(t, "ip", "link", "set", peer, "netns", ns)
	run(t, "ip", "-n", ns, "addr", "add", subnet+"1/24", "dev", peer)
	for _, d := range []string{bridge, up} {
		run(t, "ip", "link", "set", d, "up")
	}
	run(t, "ip", "-n", ns, "link", "set", peer, "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	before := tcOut(t, "-j", "qdisc", "show", "dev", up)

	sluice := livelab.MustSluiceBinary(t)
	// The limits are payload rates: the uplink's usable rate is what full
	// TCP segments carry at its line rate, so that the agent adds the
	// headers to the HTB ceils.
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(fmt.Sprintf(`cluster: vlc%s
hosts: [{name: h1, uplinks: [{name: up0, speed: 300Mbps, usable: %.0fbps}]}]
unnamedVMs: {shares: normal, limit: 50Mbps}
vms:
  - {name: %s, host: h1, nics: [{name: nic0, limit: 100Mbps}]}
`, id, math.Floor(agent.MaxPayloadBps(300e6)), domA)), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(polFile)
	if err != nil {
		t.Fatal(err)
	}

	// The agent, before any guest runs.
	state := filepath.Join(dir, "state")
	ag := exec.Command(sluice, "agent", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", polFile, "--host", "h1", "--state-dir", state)
	agentLog, _ := os.Create(filepath.Join(dir, "agent.log"))
	ag.Stdout, ag.Stderr = agentLog, agentLog
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	stopAgent := func() {
		if ag.Process != nil && ag.ProcessState == nil {
			ag.Process.Signal(syscall.SIGTERM)
			ag.Wait()
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

	// Each guest starts; its class (ceil at its limit) and classifier
	// must be in place within 2 s. Indexes: A is the first vNIC the
	// inventory sees on an uplink's bridge (1:100), B the second
	// (1:101) unless another domain of the machine took an index in
	// between; the class is found by the agent's status instead.
	type guest struct {
		name, port, ip, tap string
		limitBps            float64
		dom                 libvirt.Domain
		classID             string
	}
	guests := []*guest{
		{name: domA, port: domA + "/nic0", ip: subnet + "2", limitBps: 100e6},
		{name: domB, port: domB + "/nic0", ip: subnet + "3", limitBps: 50e6},
	}
	for i, g := range guests {
		mac := fmt.Sprintf("52:54:00:6c:%s:%02x", id[:2], i+1)
		x := netGuestXML(g.name, kernel, initrd, bridge, mac, filepath.Join(dir, g.name+".log"), g.ip+"/24", iperfPort)
		t0 := time.Now()
		g.dom, err = c.DomainCreateXML(x, 0)
		if err != nil {
			t.Fatalf("domain %s did not start: %v", g.name, err)
		}
		started := time.Now()
		g.tap = tapOf(t, c, g.dom)
		var ceil int64
		at := waitFor(t, "the class of "+g.name, 5*time.Second, func() bool {
			g.classID, ceil = statusClass(state, pol.Cluster, g.port)
			return g.classID != "" && strings.Contains(tcOut(t, "class", "show", "dev", up), "htb "+g.classID+" parent 1:") &&
				strings.Contains(tcOut(t, "filter", "show", "dev", g.tap, "ingress"), "sluice-prio")
		})
		d := at.Sub(started)
		t.Logf("%s started (create took %v); its class %s (ceil %.1f Mbps on the wire) on %s and the classifier on its tap %s %v after the start",
			g.name, started.Sub(t0).Round(time.Millisecond), g.classID, float64(ceil)/1e6, up, g.tap, d.Round(time.Millisecond))
		if d > 2*time.Second {
			t.Errorf("%s enforced %v after its start, want ≤ 2 s", g.name, d)
		}
		if w := g.limitBps; float64(ceil) < w || float64(ceil) > w*1.1 {
			t.Errorf("%s: HTB ceil %d, want its %.0f Mbps limit on the wire (≤ +10%% of headers)", g.name, ceil, w/1e6)
		}
	}
	s, err := agent.ReadStats(state, pol.Cluster, "h1")
	if err != nil {
		t.Fatal(err)
	}
	// (The status lists every running domain of the machine that the
	// policy does not name; only those on the uplink's bridge have a
	// port.)
	if !contains(s.Unnamed, domB) || contains(s.Unnamed, domA) {
		t.Errorf("agent status lists unnamed %v, want %s among them and not %s", s.Unnamed, domB, domA)
	}

	// What the derivation entitles each to, with B unnamed and both
	// sending.
	net, err := entitle.NetworkWith(pol, []entitle.UnnamedVM{{Name: domB, Host: "h1", NICs: []string{"nic0"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guests {
		if len(net.Port(g.port)) != 1 {
			t.Fatalf("the derivation has no port %s", g.port)
		}
	}
	for _, g := range guests {
		if _, err := waitConsole(filepath.Join(dir, g.name+".log"), "sl-guest: ready", lab.GuestBootTimeout); err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
	}
	classes := map[string]string{}
	for _, g := range guests {
		classes[g.port] = g.classID
	}
	for try := 1; ; try++ {
		stop := sampleBacklog(t, up, classes)
		rates := make([][]float64, len(guests))
		errs := make([]error, len(guests))
		var wg sync.WaitGroup
		for i, g := range guests {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rates[i], errs[i] = iperfFromGuest(ns, g.ip, iperfPort, flowS)
			}()
		}
		wg.Wait()
		backlogged := stop()
		for i, g := range guests {
			if errs[i] != nil {
				t.Fatalf("%s: %v", g.name, errs[i])
			}
		}
		// A second is judged when every guest's class had packets
		// waiting in ≥ MinBacklogged of the samples of it and of the
		// next (an iperf3 interval overlaps both): else a guest was
		// short of CPU (TCG guests share the machine's 2 vCPUs with
		// other tests) and did not send what it was entitled to.
		judged := func(sec int) bool {
			for b := sec; b <= sec+1; b++ {
				if b >= len(backlogged) {
					return false
				}
				for _, g := range guests {
					if backlogged[b][g.port] < MinBacklogged {
						return false
					}
				}
			}
			return true
		}
		var got []float64
		var lines []string
		n := 0
		for sec := lifecycleWarmupS; sec < flowS-1; sec++ {
			if judged(sec) {
				n++
			}
		}
		for i, g := range guests {
			var sum float64
			var k int
			var series []string
			for sec, r := range rates[i] {
				if sec >= lifecycleWarmupS && sec < flowS-1 && judged(sec) {
					sum += r
					k++
					series = append(series, fmt.Sprintf("%.0f", r/1e6))
				} else {
					series = append(series, fmt.Sprintf("(%.0f)", r/1e6))
				}
			}
			got = append(got, sum/float64(max(k, 1)))
			lines = append(lines, fmt.Sprintf("%s per second (Mbps, in parentheses not judged): %s", g.port, strings.Join(series, " ")))
		}
		why := fmt.Sprintf("%d of %d seconds after the %d s warm-up judged (every class backlogged in ≥ %.0f%% of the samples)", n, flowS-1-lifecycleWarmupS, lifecycleWarmupS, 100*MinBacklogged)
		if n < (flowS-1-lifecycleWarmupS+1)/2 {
			if try == maxTries {
				t.Fatalf("%d runs in a row, the machine could not drive the guests: %s\n%s", maxTries, why, strings.Join(lines, "\n"))
			}
			t.Logf("run %d: %s; measuring again:\n%s", try, why, strings.Join(lines, "\n"))
			continue
		}
		t.Logf("%s", why)
		for i, g := range guests {
			want := net.Port(g.port)[0].AllocBps()
			e := relErr(got[i], want)
			t.Logf("%s; mean of the judged %s, entitled %s (%s) (%+.1f%%)", lines[i], mbps(got[i]), mbps(want), net.Port(g.port)[0].Node.Reason, 100*e)
			if math.Abs(e) > 0.05 {
				t.Errorf("%s: got %s Mbps, entitled %s Mbps: error %+.1f%% exceeds ±5%%", g.port, mbps(got[i]), mbps(want), 100*e)
			}
		}
		break
	}

	// Each goes: its class goes within 2 s.
	for _, g := range guests {
		if err := c.DomainDestroy(g.dom); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		gone := waitFor(t, "the class of "+g.name+" removed", 5*time.Second, func() bool {
			return !strings.Contains(tcOut(t, "class", "show", "dev", up), "htb "+g.classID+" ")
		})
		t.Logf("%s destroyed; its class %s removed %v later", g.name, g.classID, gone.Sub(stopped).Round(time.Millisecond))
		if d := gone.Sub(stopped); d > 2*time.Second {
			t.Errorf("%s: class removed %v after the destroy, want ≤ 2 s", g.name, d)
		}
	}

	stopAgent()
	out, err := exec.Command(sluice, "agent", "uninstall", "--inventory", "libvirt", "--uplink", "up0="+up, "--policy", polFile, "--host", "h1", "--state-dir", state).CombinedOutput()
	if err != nil {
		t.Fatalf("agent uninstall: %v: %s", err, out)
	}
	if after := tcOut(t, "-j", "qdisc", "show", "dev", up); after != before {
		t.Errorf("uninstall: qdiscs of %s\nbefore %s\nafter  %s", up, before, after)
	}
}

// iperfPort is the guests' iperf3 server port; flowS how long the guests
// send, lifecycleWarmupS the seconds left out at the start (TCP and the
// agent's first demand window).
const (
	iperfPort        = 5201
	flowS            = 10
	lifecycleWarmupS = 4
)

// sampleBacklog samples the HTB classes of dev every livelab.SampleEvery
// until the returned function is called, which gives, per second from the
// start, the fraction of samples in which each port's class (ports maps
// port → class id) had packets waiting.
func sampleBacklog(t *testing.T, dev string, ports map[string]string) func() []map[string]float64 {
	t.Helper()
	k, err := agent.NewNetlinkKernel("")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	res := make(chan []map[string]float64)
	go func() {
		defer k.Close()
		start := time.Now()
		var busy []map[string]int
		var samples []int
		tick := time.NewTicker(livelab.SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				out := make([]map[string]float64, len(busy))
				for i := range busy {
					out[i] = map[string]float64{}
					for port := range ports {
						out[i][port] = float64(busy[i][port]) / float64(max(samples[i], 1))
					}
				}
				res <- out
				return
			case <-tick.C:
			}
			cs, err := k.Classes(dev)
			if err != nil {
				continue
			}
			sec := int(time.Since(start) / time.Second)
			for len(busy) <= sec {
				busy, samples = append(busy, map[string]int{}), append(samples, 0)
			}
			samples[sec]++
			for port, id := range ports {
				for _, c := range cs {
					if c.ID.String() == id && c.Queued > 0 {
						busy[sec][port]++
					}
				}
			}
		}
	}()
	return func() []map[string]float64 {
		close(done)
		return <-res
	}
}

// iperfFromGuest has the guest at ip send for durS seconds (iperf3 -R from
// namespace ns) and returns the received bits/s of each second.
func iperfFromGuest(ns, ip string, port, durS int) ([]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(durS+40)*time.Second)
	defer cancel()
	var b []byte
	var err error
	for try := 0; ; try++ {
		b, err = exec.CommandContext(ctx, "ip", "netns", "exec", ns, "iperf3", "-c", ip, "-p", strconv.Itoa(port), "-R",
			"-t", strconv.Itoa(durS), "-J", "-C", GuestTCP).Output()
		var j struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &j)
		if err == nil && j.Error != "" {
			err = errors.New(j.Error)
		} else if err != nil && j.Error != "" {
			err = fmt.Errorf("%v: %s", err, j.Error)
		}
		if err == nil || try == 10 || !(retryable(err) || strings.Contains(err.Error(), "closed unexpectedly")) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("iperf3 -R from %s: %v %s", ip, err, tailOf(string(b)))
	}
	var j struct {
		Intervals []struct {
			Sum struct {
				Seconds       float64 `json:"seconds"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum"`
		} `json:"intervals"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("iperf3 output: %v", err)
	}
	var out []float64
	for _, iv := range j.Intervals {
		if iv.Sum.Seconds >= 0.5 {
			out = append(out, iv.Sum.BitsPerSecond)
		}
	}
	if len(out) <= lifecycleWarmupS {
		return nil, fmt.Errorf("iperf3 reported %d intervals", len(out))
	}
	return out, nil
}

func meanFrom(v []float64, from int) float64 {
	if from >= len(v) {
		return 0
	}
	s := 0.0
	for _, x := range v[from:] {
		s += x
	}
	return s / float64(len(v)-from)
}

// netGuestXML is a TCG guest on bridge with one vNIC (alias ua-nic0) that
// the guest configures with addr and serves iperf3 on (lab.GuestScript);
// it powers itself off after 3 minutes.
func netGuestXML(name, kernel, initrd, bridge, mac, console, addr string, port int) string {
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 sl.net=eth0,%s, sl.iperf=%d sl.ttl=180</cmdline>
  </os>
  <cpu mode='maximum' check='none'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <filesystem type='mount' accessmode='passthrough' multidevs='remap'>
      <source dir='/'/>
      <target dir='hostroot'/>
      <readonly/>
    </filesystem>
    <interface type='bridge'>
      <source bridge='%s'/>
      <mac address='%s'/>
      <model type='virtio'/>
      <alias name='ua-nic0'/>
    </interface>
    <serial type='file'>
      <source path='%s'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>`, name, kernel, initrd, addr, port, bridge, mac, console)
}
