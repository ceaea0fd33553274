package netlive

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/livetest/livelab"
	"sluice/policy"
)

// TestTopLive: in a lab from `sluice lab up`, with the agent binary
// enforcing Fig. 2 step a while three VMs send, `sluice top` runs in a
// tmux pane. Once the flows are steady, the screen (capture-pane, once a
// second for five seconds) shows each VM's vNIC with a measured rate
// whose median is within 5% of alloc's entitlement, and its ENT column
// within 5% too; keys sort it (send-keys e: by entitlement, vm1 first; n:
// by name) and q quits it.
func TestTopLive(t *testing.T) {
	requireLive(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("the top test needs tmux (scripts/deps.sh installs it)")
	}
	dir := t.TempDir()
	bin := livelab.MustSluiceBinary(t)
	text := strings.ReplaceAll(fig2Policy, "cluster: nf2", "cluster: ntop")
	l := upLabCLI(t, bin, text)
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	usable := l.measureUsable("h1", ports...)
	p := l.withUsable(usable)
	want := livelab.Entitlements(p, "h1", usable, append([]string{"h1/vm"}, ports...)...)
	rate := policy.FormatRate(policy.Bps(int64(usable/1e3) * 1e3))
	pfile := filepath.Join(dir, "policy-usable.yaml")
	if err := os.WriteFile(pfile, []byte(strings.ReplaceAll(text, "speed: 1Gbps}", "speed: 1Gbps, usable: "+rate+"}")), 0o644); err != nil {
		t.Fatal(err)
	}

	// The agent binary, dynamic, writing its statistics into dir.
	stats := agent.StatsPath(dir, "ntop", "h1")
	ag := exec.Command(bin, "agent", "--host", "h1", "--policy", pfile, "--state-dir", dir, "--metrics-listen", "")
	ag.Stderr = os.Stderr
	ag.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	agDone := make(chan struct{})
	go func() { _ = ag.Wait(); close(agDone) }()
	t.Cleanup(func() { _ = ag.Process.Kill(); <-agDone })
	for start := time.Now(); ; {
		if _, err := os.Stat(stats); err == nil {
			break
		}
		select {
		case <-agDone:
			t.Fatal("sluice agent exited before its first step")
		default:
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("sluice agent wrote no statistics within 10 s")
		}
		time.Sleep(10 * time.Millisecond) // polling another process, with a deadline
	}

	// The flows outlast the sampling (steady within 12 s, the screen
	// within 10 s more, five samples, the sorting) and end with the test.
	const durS = 60
	stopFlows := l.backgroundFlows(durS, l.nicFlow(ports[0], 1), l.nicFlow(ports[1], 1), l.nicFlow(ports[2], 1))
	defer stopFlows()
	if _, err := l.waitSteady("h1", ports, 12*time.Second); err != nil {
		t.Fatalf("the agent did not bring the flows to steady rates: %v", err)
	}

	session := fmt.Sprintf("sl-top-%d", os.Getpid())
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %s: %v %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	topCmd := fmt.Sprintf("%s top --host h1 --policy %s --state-dir %s --gateway-dir %s --interval 500ms", bin, pfile, dir, dir)
	tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "40", topCmd)
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
	screen := func() string { return tmux("capture-pane", "-p", "-t", session) }
	// row parses the line of port from a screen: its ENT and RATE (Mbps).
	row := func(s, port string) (ent, rate float64, ok bool) {
		for _, line := range strings.Split(s, "\n") {
			f := strings.Fields(strings.TrimPrefix(line, ">"))
			if len(f) >= 5 && f[1] == port {
				e, err1 := strconv.ParseFloat(f[3], 64)
				r, err2 := strconv.ParseFloat(f[4], 64)
				return e * 1e6, r * 1e6, err1 == nil && err2 == nil
			}
		}
		return 0, 0, false
	}
	// waitScreen polls the pane until cond holds (top redraws every
	// 500 ms), with a deadline.
	waitScreen := func(what string, cond func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := screen()
			if cond(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("sluice top did not show %s within 10 s; the screen:\n%s", what, s)
			}
			time.Sleep(100 * time.Millisecond) // polling another process, with a deadline
		}
	}
	waitScreen("the three vNICs", func(s string) bool {
		for _, p := range ports {
			if _, _, ok := row(s, p); !ok {
				return false
			}
		}
		return true
	})
	// Five screens, one a second: the measured rates' medians.
	rates := map[string][]float64{}
	ents := map[string]float64{}
	var last string
	for i := 0; i < 5; i++ {
		if i > 0 {
			time.Sleep(time.Second) // one sample a second: the measurement's own pace
		}
		last = screen()
		for _, p := range ports {
			e, r, ok := row(last, p)
			if !ok {
				t.Fatalf("screen %d lacks %s:\n%s", i, p, last)
			}
			rates[p] = append(rates[p], r)
			ents[p] = e
		}
	}
	t.Logf("sluice top, last screen:\n%s", last)
	for _, p := range ports {
		med := median(rates[p])
		t.Logf("%s: top's rates %s Mbps (median %s), top's entitlement %s, alloc's %s Mbps", p, mbpsList(rates[p]), mbps(med), mbps(ents[p]), mbps(want[p]))
		if e := relErr(med, want[p]); math.Abs(e) > 0.05 {
			t.Errorf("%s: top shows a median rate of %s Mbps, entitled %s: %+.1f%% (want within 5%%)", p, mbps(med), mbps(want[p]), 100*e)
		}
		if e := relErr(ents[p], want[p]); math.Abs(e) > 0.05 {
			t.Errorf("%s: top shows an entitlement of %s Mbps, alloc's is %s: %+.1f%%", p, mbps(ents[p]), mbps(want[p]), 100*e)
		}
	}
	// Sorting: e puts the vNIC with the largest entitlement (vm1's
	// reservation) before the others; n orders the rows by port name.
	order := func(s string) []string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if f := strings.Fields(strings.TrimPrefix(line, ">")); (strings.HasPrefix(line, " ") || strings.HasPrefix(line, ">")) && len(f) > 10 {
				out = append(out, f[1])
			}
		}
		return out
	}
	vnics := func(s string) string {
		var out []string
		for _, port := range order(s) {
			if strings.HasPrefix(port, "vm") {
				out = append(out, port)
			}
		}
		return strings.Join(out, " ")
	}
	tmux("send-keys", "-t", session, "e")
	waitScreen("sort: entitled with vm1/nic0 first", func(s string) bool {
		return strings.Contains(s, "sort: entitled") && strings.HasPrefix(vnics(s), "vm1/nic0 ")
	})
	tmux("send-keys", "-t", session, "n")
	waitScreen("sort: name, rows by port name", func(s string) bool {
		o := order(s)
		return strings.Contains(s, "sort: name") && len(o) > 3 && slices.IsSorted(o)
	})
	tmux("send-keys", "-t", session, "q")
	deadline := time.Now().Add(5 * time.Second)
	for exec.Command("tmux", "has-session", "-t", session).Run() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("sluice top did not quit on q:\n%s", screen())
		}
		time.Sleep(50 * time.Millisecond) // polling tmux, with a deadline
	}
}
