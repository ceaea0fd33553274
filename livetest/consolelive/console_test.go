// Package consolelive drives the controller's web console in headless
// Chromium against a running cluster: the real `sluice controller`
// (embedded etcd), one real `sluice agent --controller` per host of a lab
// of network namespaces (seed Fig. 2 at 1/10 scale) and iperf3 from the
// VMs, so that the agents report measured rates. Every page must load
// without a console error or an exception, the chart must show the
// reports' samples, explain must answer for vm1/nic0, and a what-if of
// Fig. 2 step b must name vm2's move and the rates after it while the
// stored state stays as it was. It saves a screenshot of each page
// (-screenshots DIR; docs/img/console-*.png are copies). Root, Chromium
// (scripts/deps.sh installs Debian's chromium), ip, tc and iperf3 are
// required: without them the test fails and says what is missing.
package consolelive

import (
	"context"
	"encoding/json"
	"flag"
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

	"github.com/chromedp/chromedp"

	"sluice/controller"
	"sluice/entitle"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/placement"
	"sluice/policy"
)

var (
	bin   string // the sluice binary built for the test
	shots = flag.String("screenshots", "../../out/console", "directory for the screenshots of the console's pages")
)

func TestMain(m *testing.M) { os.Exit(livelab.RunWithSluice(m, &bin)) }

// labPolicy is seed Fig. 2 at 1/10 scale: two hosts with one 1 Gbps
// uplink, three VMs with equal shares on h1.
const labPolicy = `# Fig. 2 at 1/10 scale, for the web console's test (livetest/consolelive).
cluster: ucon
reservationCap: 0.75
hosts:
  - {name: h1, cpu: {cores: 16, mhz: 2600}, memory: 128GiB, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, cpu: {cores: 16, mhz: 2600}, memory: 128GiB, uplinks: [{name: up0, speed: 1Gbps}]}
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
  - {name: vm2, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
`

// Seed Fig. 2 at 1/10 scale: step a (made) and step b (asked as a what-if).
const (
	stepA = "vm1/nic0.reservation=750Mbps"
	stepB = "vm2/nic0.reservation=450Mbps"
)

// requireLive fails the test, with what is missing, when the machine
// cannot run it.
func requireLive(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the console's live test needs root (network namespaces, tc): run it as root")
	}
	for _, tool := range []string{"ip", "tc", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the console's live test needs %s (scripts/deps.sh installs it)", tool)
		}
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the console's live test needs Chromium: no chromium on PATH (scripts/deps.sh installs Debian's chromium)")
	return ""
}

func TestConsoleLive(t *testing.T) {
	chromium := requireLive(t)
	testStart := time.Now()
	dir := t.TempDir()
	ctx := context.Background()

	p, polFile, state := livelab.UpLab(t, dir, "policy.yaml", labPolicy)
	plan, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}

	// The controller (reports every second: a lease of 3 s), step a, the
	// agents.
	data := filepath.Join(dir, "data")
	port := livelab.FreePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	livelab.StartController(t, bin, data, []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--host-ttl", "3", "--metrics-listen", ""})
	conn := []string{"--server", server, "--data-dir", data}
	ctl(t, conn, 0, "apply", "-f", polFile)
	ctl(t, conn, 0, "set", "vm1/nic0", "reservation=750Mbps", "--reason", "seed Fig. 2 step a")
	tokFile := filepath.Join(data, controller.TokenFile)
	tok, err := controller.ReadToken(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(data, controller.CertFile)
	cl, err := controller.NewClient(server, tok, ca)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		livelab.StartSluice(t, bin, dir, "agent-"+h, syscall.SIGTERM, "agent", "--host", h, "--controller", server, "--token-file", tokFile, "--ca", ca,
			"--state-dir", filepath.Join(dir, "agent-"+h), "--lab-state-dir", state, "--metrics-listen", "")
	}
	waitFor(t, 20*time.Second, "the agents of h1 and h2 register and h1's reports vm1, vm2, vm3 running", func() bool {
		vs, err := cl.VMs(ctx)
		if err != nil || len(vs) != 3 {
			return false
		}
		for _, v := range vs {
			if v.State != "running" || v.Observed != "h1" {
				return false
			}
		}
		hs, err := cl.Hosts(ctx)
		return err == nil && len(hs) == 2 && hs[0].Registered && hs[1].Registered
	})

	// iperf3 from the three VMs, so that the reports carry real rates.
	startFlows(t, plan, []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}, 120)
	const minSamples = 10
	waitFor(t, 40*time.Second, fmt.Sprintf("%d reports with vm1/nic0 sending in the controller's history", minSamples), func() bool {
		h, err := cl.History(ctx, "vm1/nic0")
		if err != nil || len(h.Ports) != 1 {
			return false
		}
		n := 0
		for _, s := range h.Ports[0].Samples {
			if s.MeasuredBps > 1e6 {
				n++
			}
		}
		return n >= minSamples
	})

	// sluice top's view of the same cluster through the controller: a row
	// per vNIC on h1, with the entitlement of the history's last sample
	// and a measured rate (its accuracy is TestTopLive's: top of a local
	// agent within 5% of the entitlements).
	checkTopController(t, cl, []string{"--controller", server, "--token-file", tokFile, "--ca", ca})

	// The browser, its console read from the start.
	b := newBrowser(t, chromium)
	must := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, steps...); err != nil {
			t.Fatalf("%s: %v%s", what, err, b.messages())
		}
	}
	rows := func(table string) [][]string {
		t.Helper()
		v, err := chromedp.Run(b.ctx, chromedp.Evaluate[[][]string](fmt.Sprintf(
			`Array.from(document.querySelectorAll(%q)).map(r => Array.from(r.cells).map(c => c.textContent))`, "#"+table+" tr")))
		if err != nil {
			t.Fatalf("rows of %s: %v", table, err)
		}
		return v
	}
	shoot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot of %s: %v", name, err)
		}
		if err := os.MkdirAll(*shots, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*shots, "console-"+name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(page string) {
		t.Helper()
		must("open the "+page+" page",
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`nav a[data-page=%q]`, page))),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.body.dataset.loaded === %q`, page), chromedp.WithPollingTimeout(15*time.Second)))
	}

	// Sign in with the operator's token.
	must("sign in",
		chromedp.Navigate(server+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Click(chromedp.CSS("#login-form button")),
		chromedp.WaitVisible(chromedp.ID("nav")))

	open("hosts")
	hosts := rows("hosts-table")
	if len(hosts) != 3 || hosts[1][0] != "h1" || hosts[1][1] != "registered" || hosts[2][0] != "h2" || hosts[2][1] != "registered" {
		t.Errorf("hosts page: %q", hosts)
	}
	shoot("hosts")

	open("vms")
	for _, r := range rows("vms-table")[1:] {
		if r[1] != "h1" || r[2] != "h1" || r[3] != "running" {
			t.Errorf("VMs page: %q, want desired h1, observed h1, running", r)
		}
	}
	shoot("vms")

	open("charts")
	must("the chart of vm1/nic0 shows the history's samples", chromedp.Poll[chromedp.Void](fmt.Sprintf(
		`(() => { const c = document.querySelector('.chart[data-port="vm1/nic0"]'); return c && c.querySelector("canvas") && +c.dataset.points >= %d })()`, minSamples),
		chromedp.WithPollingTimeout(15*time.Second)))
	points, err := chromedp.Run(b.ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries(Array.from(document.querySelectorAll(".chart")).map(c => [c.dataset.port, c.dataset.points + " | " + c.querySelector("h3").textContent]))`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("charts: %q", points)
	for _, port := range []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"} {
		if _, ok := points[port]; !ok {
			t.Errorf("no chart of %s: %q", port, points)
		}
	}
	shoot("charts")

	open("events")
	events := rows("events-table")
	if !strings.Contains(fmt.Sprint(events), stepA) || !strings.Contains(fmt.Sprint(events), "seed Fig. 2 step a") {
		t.Errorf("events page has no event of step a: %q", events)
	}
	shoot("events")

	open("explain")
	want, err := cl.Explain(ctx, "vm1/nic0")
	if err != nil {
		t.Fatal(err)
	}
	must("explain vm1/nic0",
		chromedp.SendKeys(chromedp.ID("explain-port"), "vm1/nic0"),
		chromedp.Click(chromedp.CSS("#explain-form button")),
		chromedp.Poll[chromedp.Void](`(t => t !== "" && t !== "…")(document.getElementById("explain-out").textContent)`, chromedp.WithPollingTimeout(10*time.Second)))
	got, err := chromedp.Run(b.ctx, chromedp.TextContent(chromedp.ID("explain-out")))
	if err != nil || got != strings.Join(want.Lines, "\n") || !strings.Contains(got, "vm1/nic0") {
		t.Errorf("explain of vm1/nic0 on the page:\n%s\nthe API's:\n%s (%v)", got, strings.Join(want.Lines, "\n"), err)
	}
	shoot("explain")

	// What if step b: vm2 moves to h2; nothing changes.
	before := stored(t, cl)
	open("what-if")
	must("what-if of step b",
		chromedp.SendKeys(chromedp.ID("whatif-changes"), stepB),
		chromedp.Click(chromedp.CSS("#whatif-form button")),
		chromedp.WaitVisible(chromedp.ID("whatif-verdict")))
	verdict, _ := chromedp.Run(b.ctx, chromedp.TextContent(chromedp.ID("whatif-verdict")))
	moves := rows("whatif-moves")
	if !strings.HasPrefix(verdict, "Admitted") || len(moves) != 2 || moves[1][0] != "vm2" || moves[1][1] != "h1" || moves[1][2] != "h2" {
		t.Errorf("what-if of %s: %q, moves %q", stepB, verdict, moves)
	}
	// The rates after it, as sluice alloc computes them for the policy
	// with step b made and vm2 on h2.
	wantAfter := allocAfter(t, p, []string{stepA, stepB}, map[string]string{"vm2": "h2"})
	for _, r := range rows("whatif-rates")[1:] {
		w, ok := wantAfter[r[0]]
		gotBps, err := parseRate(r[3])
		if !ok || err != nil || r[1] != w.uplink || math.Abs(gotBps-w.bps) > 0.005*w.bps {
			t.Errorf("what-if rate of %s: %q, want %s on %s (%v)", r[0], r, entitle.FormatBps(w.bps), w.uplink, err)
		}
		t.Logf("what-if of step b on the page: %s on %s, %s now → %s", r[0], r[1], r[2], r[3])
	}
	shoot("what-if")
	if after := stored(t, cl); after != before {
		t.Errorf("the what-if changed the controller's state:\nbefore\n%s\nafter\n%s", before, after)
	}
	// sluice ctl what-if says the same.
	if out := ctl(t, conn, 0, "what-if", stepB); !strings.Contains(out, "vm2 h1 → h2") {
		t.Errorf("sluice ctl what-if %s:\n%s", stepB, out)
	}
	if after := stored(t, cl); after != before {
		t.Errorf("sluice ctl what-if changed the controller's state:\nbefore\n%s\nafter\n%s", before, after)
	}

	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the console's pages wrote %d errors or exceptions:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	t.Logf("all pages loaded; %d console messages (the probe included), none an error or exception; the test took %v", b.count(), time.Since(testStart).Round(time.Second))
}

// browser is a headless Chromium tab with its console's messages.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
}

func newBrowser(t *testing.T, path string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.IgnoreCertErrors, chromedp.WindowSize(1280, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	b := &browser{ctx: ctx}
	msgs := chromedp.Console(ctx) // starts the browser; subscribed before the first page
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.msgs = append(b.msgs, m)
			b.mu.Unlock()
		}
	}()
	if _, err := chromedp.Run(ctx, chromedp.Title()); err != nil {
		t.Fatalf("headless Chromium (%s) did not start: %v", path, err)
	}
	// The console is read: a message written now arrives.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`console.info("consolelive: the console is read")`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the probe message from the page's console", func() bool { return b.count() > 0 })
	return b
}

// errors are the messages that are errors or exceptions, with where they
// came from.
func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.msgs {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			out = append(out, fmt.Sprintf("%s (%s:%d %s)", m, m.URL, m.Line, m.Source))
		}
	}
	return out
}

func (b *browser) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

// messages renders every message so far, for a failure.
func (b *browser) messages() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s strings.Builder
	for _, m := range b.msgs {
		fmt.Fprintf(&s, "\n  console: %s", m)
	}
	return s.String()
}

// stored is what the controller keeps, as a client reads it: the policy,
// each host's desired state (with its etcd revision), the events and
// the decisions.
func stored(t *testing.T, cl *controller.Client) string {
	t.Helper()
	ctx := context.Background()
	var parts []any
	pol, err := cl.Policy(ctx)
	parts = append(parts, pol, err)
	for _, h := range []string{"h1", "h2"} {
		d, err := cl.WatchDesired(ctx, h, 0, 0)
		parts = append(parts, d, err)
	}
	evs, err := cl.Events(ctx, 0)
	parts = append(parts, evs, err)
	ds, err := cl.Decisions(ctx)
	parts = append(parts, ds, err)
	b, err := json.MarshalIndent(parts, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type rateOn struct {
	uplink string
	bps    float64
}

// allocAfter is every vNIC's rate, with every demand unbounded, in p with
// changes made and the VMs of hosts moved: what `sluice alloc` gives.
func allocAfter(t *testing.T, p *policy.Policy, changes []string, hosts map[string]string) map[string]rateOn {
	t.Helper()
	q := *p
	q.VMs = append([]policy.VM(nil), p.VMs...)
	for i := range q.VMs {
		if h, ok := hosts[q.VMs[i].Name]; ok {
			q.VMs[i].Host = h
		}
	}
	cur := &q
	for _, spec := range changes {
		ch, err := placement.ParseChange(spec)
		if err != nil {
			t.Fatal(err)
		}
		if cur, err = ch.Policy(cur, nil); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
	}
	n, err := entitle.Network(cur, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.Compute()
	out := map[string]rateOn{}
	for _, pt := range n.Ports {
		if pt.Kind == entitle.KindVNIC {
			out[pt.Name] = rateOn{uplink: pt.Host + "/" + pt.Uplink, bps: pt.AllocBps()}
		}
	}
	return out
}

// parseRate reads a rate as the console prints it ("875 Mbps").
func parseRate(s string) (float64, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), " ")
	v, err := strconv.ParseFloat(num, 64)
	mult := map[string]float64{"bps": 1, "Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9}[unit]
	if !ok || err != nil || mult == 0 {
		return 0, fmt.Errorf("%q is not a rate", s)
	}
	return v * mult, nil
}

// waitFor polls ok every 100 ms until it holds or within has passed.
func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkTopController runs `sluice top --once` against the controller
// (conn: its flags) and checks the rows of vm1..vm3's vNICs.
func checkTopController(t *testing.T, cl *controller.Client, conn []string) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"top", "--once", "--sort", "name"}, conn...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice top --controller: %v\n%s", err, out)
	}
	h, err := cl.History(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]controller.Sample{}
	for _, p := range h.Ports {
		if len(p.Samples) > 0 {
			last[p.Port] = p.Samples[len(p.Samples)-1]
		}
	}
	for _, port := range []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"} {
		var f []string
		for _, line := range strings.Split(string(out), "\n") {
			if g := strings.Fields(strings.TrimPrefix(line, ">")); len(g) >= 5 && g[1] == port {
				f = g
			}
		}
		if f == nil {
			t.Fatalf("sluice top --controller shows no row of %s:\n%s", port, out)
		}
		ent, err1 := strconv.ParseFloat(f[3], 64)
		rate, err2 := strconv.ParseFloat(f[4], 64)
		want := last[port].EntitledBps / 1e6
		if err1 != nil || err2 != nil || f[2] != "h1" || math.Abs(ent-want) > 0.1 || rate < want/2 {
			t.Errorf("sluice top --controller, %s: host %s, ENT %s, RATE %s Mbps; want h1, the history's %.1f and a rate of the flow:\n%s", port, f[2], f[3], f[4], want, out)
		}
	}
	t.Logf("sluice top --controller --once:\n%s", out)
}

// ctl runs `sluice ctl` (livelab.Ctl).
func ctl(t *testing.T, conn []string, want int, args ...string) string {
	t.Helper()
	return livelab.Ctl(t, bin, conn, want, args...)
}

// startFlows runs one iperf3 client per port from its VM to the port's
// server in the fabric for durS seconds (killed at the end of the test).
func startFlows(t *testing.T, plan *lab.Plan, ports []string, durS int) {
	t.Helper()
	for _, port := range ports {
		vm, _, _ := strings.Cut(port, "/")
		cmd := exec.Command("ip", "netns", "exec", plan.VM(vm).Name, "iperf3", "-c", lab.FabricIP.String(),
			"-p", strconv.Itoa(plan.NIC(port).IperfPort), "-t", strconv.Itoa(durS))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
