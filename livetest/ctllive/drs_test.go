package ctllive

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
	"sluice/controller"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/placement"
	"sluice/policy"
)

// drsPolicy is seed 000's Fig. 2 at 1/10 scale: two hosts with one 1 Gbps
// uplink each, three VMs with equal shares on h1 and no reservation yet
// (the steps set them). reservationCap 0.75 lets 750 Mbps of an uplink be
// reserved.
const drsPolicy = `# Fig. 2 at 1/10 scale, for the controller's DRS (livetest/ctllive).
cluster: cdrs
reservationCap: 0.75
hosts:
  - name: h1
    cpu: {cores: 16, mhz: 2600}
    memory: 128GiB
    uplinks: [{name: up0, speed: 1Gbps%s}]
  - name: h2
    cpu: {cores: 16, mhz: 2600}
    memory: 128GiB
    uplinks: [{name: up0, speed: 1Gbps%s}]
trafficClasses:
  vm: {shares: normal}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
  - {name: vm2, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, shares: normal}]}
`

// tol is the allowed error of a measured rate against the entitlement.
const tol = 0.05

// stepWindowS is the measurement window of a step, from when every VM
// reached its new rate: 8 s, so that the median holds when the shared
// machine disturbs two of its seconds (seen under load 12: 774/91/91 and
// 736/99/99 Mbps in judged seconds among 818/70/70).
const stepWindowS = 8

// maxMoveS is the target from `ctl set` to the moved VM running at its
// new rate.
const maxMoveS = 10.0

// TestFig2DRSLive runs seed Fig. 2 end to end in the lab at 1/10 scale
// through the real controller (embedded etcd, DRS automatic) and one real
// `sluice agent --controller` per host, with iperf3 from the three VMs
// running throughout. The steps are `sluice ctl set`: a (vm1 R=750 Mbps),
// b (vm2 R=450 Mbps: h1's reservations no longer fit, DRS moves vm2 to h2
// by itself, h2's agent re-plugs it), c (vm3 R=300 Mbps: vm3 moves). After
// each step every VM's measured rate (median of the judged seconds) is
// within 5% of alloc's entitlement on the measured usable rate, and the
// moved VM runs at its new rate within 10 s of the `ctl set`. Between b
// and c the controller is killed with SIGKILL: the agents keep the rates
// (measured), and after a restart on the same data directory the events,
// decisions, VMs and policy are all there and no migration is repeated.
func TestFig2DRSLive(t *testing.T) {
	requireLive(t)
	testStart := time.Now()
	dir := t.TempDir()
	ctx := context.Background()

	// The lab, and its usable rate measured with the three flows.
	p0, _, state := livelab.UpLab(t, dir, "lab.yaml", fmt.Sprintf(drsPolicy, "", ""))
	plan, err := lab.NewPlan(p0)
	if err != nil {
		t.Fatal(err)
	}
	ports := []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"}
	usable := measureUsable(t, p0, "h1", ports)
	p := livelab.WithUsable(p0, usable)

	// The controller, the policy with the usable rate, the agents.
	data := filepath.Join(dir, "data")
	port := livelab.FreePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	cargs := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--drs", "automatic", "--drs-interval", "1s", "--host-ttl", "6"}
	d := startController(t, data, cargs)
	conn := []string{"--server", server, "--data-dir", data}
	rate := policy.FormatRate(policy.Bps(int64(usable/1e3) * 1e3))
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(fmt.Sprintf(drsPolicy, ", usable: "+rate, ", usable: "+rate)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl(t, conn, 0, "apply", "-f", polFile)
	tok, err := controller.ReadToken(filepath.Join(data, "token"))
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(data, "tls", "cert.pem")
	cl, err := controller.NewClient(server, tok, ca)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		startAgent(t, dir, state, h, server, filepath.Join(data, "token"), ca)
	}
	if err := poll(ctx, 15*time.Second, func() bool {
		hs, err := cl.Hosts(ctx)
		return err == nil && len(hs) == 2 && hs[0].Registered && hs[1].Registered
	}); err != nil {
		t.Fatal("the two agents did not register within 15 s")
	}

	// iperf3 throughout.
	rw := watchReceivers(t, plan, ports)
	stopFlows, _ := startFlows(t, plan, ports, 300)
	defer stopFlows()
	if err := poll(ctx, 10*time.Second, func() bool {
		now := time.Now()
		for _, pt := range ports {
			if r, ok := rw.rate(pt, now.Add(-500*time.Millisecond), now); !ok || r < 1e6 {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal("the three iperf3 flows did not start within 10 s")
	}

	s := &drsRun{t: t, ctx: ctx, cl: cl, rw: rw, usable: usable, base: p, conn: conn, dir: dir,
		hosts: map[string]string{"vm1": "h1", "vm2": "h1", "vm3": "h1"}, machine: livelab.WatchMachine(t)}
	// Before step a the flows, which started on the new agents' trees,
	// run at their entitlements (equal shares): the agents' start-up
	// convergence (docs/perf/network.md, "Known limit") is not step a's.
	_, want0 := s.expected()
	started := time.Now()
	if err := poll(ctx, 20*time.Second, func() bool {
		now := time.Now()
		for pt, w := range want0 {
			if r, ok := rw.rate(pt, now.Add(-time.Second), now); !ok || math.Abs(relErr(r, w)) > tol {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("the flows did not reach their entitlements before step a within 20 s: %s", s.trajectory(started, time.Now()))
	}
	t.Logf("before step a: every VM at its entitlement (1-s window within 5%%) %.1f s after the flows started", time.Since(started).Seconds())
	var report []string
	report = append(report, s.step("a", "vm1/nic0", "reservation=750Mbps", "", "seed Fig. 2 step a"))
	report = append(report, s.step("b", "vm2/nic0", "reservation=450Mbps", "vm2", "seed Fig. 2 step b"))

	// kill -9 of the controller: the agents keep enforcing.
	if err := poll(ctx, 10*time.Second, func() bool {
		ds, err := cl.Decisions(ctx)
		return err == nil && len(ds) == 1 && ds[0].Status == "done"
	}); err != nil {
		ds, _ := cl.Decisions(ctx)
		t.Fatalf("vm2's migration not done (reported by h2's agent) within 10 s: %+v", ds)
	}
	before := snapshot(t, conn)
	d.Kill()
	killed := time.Now()
	report = append(report, s.hold("controller killed (SIGKILL), agents alone", killed, 5*time.Second))
	d = startController(t, data, cargs)
	restarted := time.Now()
	after := snapshot(t, conn)
	for _, k := range []string{"decisions", "vms", "policy"} {
		if after[k] != before[k] {
			t.Errorf("%s after kill -9 and a restart:\n%s\nbefore:\n%s", k, after[k], before[k])
		}
	}
	if !eventsPrefix(t, before["events"], after["events"]) {
		t.Errorf("events after kill -9 and a restart do not begin with those before:\n%s\nbefore:\n%s", after["events"], before["events"])
	}
	// The restarted controller runs its DRS passes (every 1 s) while the
	// agents reconnect: the rates hold and nothing moves again.
	report = append(report, s.hold("controller restarted on the same data directory", restarted, 5*time.Second))
	if err := poll(ctx, 10*time.Second, func() bool {
		hs, err := cl.Hosts(ctx)
		return err == nil && len(hs) == 2 && hs[0].Registered && hs[1].Registered
	}); err != nil {
		t.Error("the agents were not registered with the restarted controller within 10 s")
	}
	evs, err := cl.Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Time.After(killed) && (e.Kind == "migrate" || e.Kind == "recommend" || e.Kind == "fault") {
			t.Errorf("after the restart: %s event %q (a migration repeated?)", e.Kind, e.Message)
		}
	}
	if got := snapshot(t, conn)["decisions"]; got != before["decisions"] {
		t.Errorf("decisions changed after the restart (a migration repeated?):\n%s\nbefore:\n%s", got, before["decisions"])
	}

	report = append(report, s.step("c", "vm3/nic0", "reservation=300Mbps", "vm3", "seed Fig. 2 step c"))
	stopFlows()
	t.Logf("Fig. 2 through the controller (DRS automatic), usable %s Mbps, medians of the judged seconds; the whole test took %v:\n%s",
		mbps(usable), time.Since(testStart).Round(time.Second), strings.Join(report, "\n"))
	if err := rw.err(); err != nil {
		t.Fatalf("receiver watch: %v", err)
	}
}

// drsRun is the state of the Fig. 2 run: where the seed puts the VMs and
// the changes made so far, from which each step's expectations derive.
type drsRun struct {
	t       *testing.T
	ctx     context.Context
	cl      *controller.Client
	rw      *receiverWatch
	usable  float64
	base    *policy.Policy
	changes []string
	hosts   map[string]string // VM → host, as the seed says
	conn    []string
	dir     string // the agents' state directories are dir/agent-HOST
	htb     []htbSample
	machine *livelab.MachineWatch // the machine's load over the whole run
}

// htbSample is the HTB rate (wire bits/s) the agents had set on each
// vNIC's class ("HOST|VM/NIC"), read from their statistics files.
type htbSample struct {
	at   time.Time
	rate map[string]float64
}

// sampleHTB reads both agents' statistics.
func (s *drsRun) sampleHTB() {
	m := map[string]float64{}
	for _, h := range []string{"h1", "h2"} {
		st, err := agent.ReadStats(filepath.Join(s.dir, "agent-"+h), "cdrs", h)
		if err != nil {
			continue
		}
		for _, u := range st.Uplinks {
			for _, pt := range u.Ports {
				if strings.Contains(pt.Port, "/nic") {
					m[h+"|"+pt.Port] = float64(pt.GuaranteeBps)
				}
			}
		}
	}
	s.htb = append(s.htb, htbSample{time.Now(), m})
}

// htbAt is the HTB rate of port on host in the last statistics read at
// or before t (-1: none, or the port is not on host's tree).
func (s *drsRun) htbAt(host, port string, t time.Time) float64 {
	r := -1.0
	for _, h := range s.htb {
		if h.at.After(t) {
			break
		}
		r = -1
		if v, ok := h.rate[host+"|"+port]; ok {
			r = v
		}
	}
	return r
}

// applied is when the agent of host first had an HTB rate for port other
// than the one it had at `from` (a new rate, or the class of a VM that
// arrived), read from its statistics (written every 100 ms, read every
// 100 ms); ok false when it never did.
func (s *drsRun) applied(host, port string, from time.Time) (time.Duration, bool) {
	was := s.htbAt(host, port, from)
	for _, h := range s.htb {
		if !h.at.After(from) {
			continue
		}
		v, ok := h.rate[host+"|"+port]
		if !ok {
			v = -1
		}
		if v != was && v >= 0 {
			return h.at.Sub(from), true
		}
	}
	return 0, false
}

// expected returns the policy of the seed's step (changes made, VMs where
// the seed puts them) and alloc's entitlement of every port on the
// measured usable rate.
func (s *drsRun) expected() (*policy.Policy, map[string]float64) {
	s.t.Helper()
	p := s.base
	for _, spec := range s.changes {
		ch, err := placement.ParseChange(spec)
		if err != nil {
			s.t.Fatal(err)
		}
		if p, _, err = ch.Apply(p, placement.Placement{}); err != nil {
			s.t.Fatalf("change %s: %v", spec, err)
		}
	}
	p = withHosts(p, s.hosts)
	want := map[string]float64{}
	for _, h := range []string{"h1", "h2"} {
		active := []string{h + "/vm"}
		for _, pt := range s.portsOn(h) {
			active = append(active, pt)
		}
		for k, v := range livelab.Entitlements(p, h, s.usable, active...) {
			if slices.Contains(active, k) && strings.Contains(k, "/nic") {
				want[k] = v
			}
		}
	}
	return p, want
}

func (s *drsRun) portsOn(host string) []string {
	var out []string
	for _, vm := range []string{"vm1", "vm2", "vm3"} {
		if s.hosts[vm] == host {
			out = append(out, vm+"/nic0")
		}
	}
	return out
}

// step applies one change with `sluice ctl set` and judges it: moved (a
// VM the seed moves, "" for none) must run on its new host in the
// controller's view and at its new rate within maxMoveS; then every VM's
// median over the judged seconds is within tol of its entitlement.
func (s *drsRun) step(name, target, change, moved, reason string) string {
	t := s.t
	t.Helper()
	s.changes = append(s.changes, target+"."+change)
	if moved != "" {
		s.hosts[moved] = "h2"
	}
	p, want := s.expected()
	watches := s.watch(p)
	s.sampleHTB()
	set := time.Now()
	out := ctl(t, s.conn, 0, "set", target, change, "--reason", reason)
	t.Logf("step %s: sluice ctl set %s %s (%v): %s", name, target, change, time.Since(set).Round(time.Millisecond), strings.TrimSpace(out))
	line := fmt.Sprintf("step %s (%s %s):", name, target, change)
	// The step has taken effect when every port ran at its new rate
	// (within tol over the last second); the moved VM's time is the
	// migration's, asserted.
	var took, movedTook time.Duration
	err := poll(s.ctx, 20*time.Second, func() bool {
		s.sampleHTB()
		now := time.Now()
		if now.Sub(set) < time.Second {
			return false
		}
		all := true
		for pt, w := range want {
			r, ok := s.rw.rate(pt, now.Add(-time.Second), now)
			in := ok && math.Abs(relErr(r, w)) <= tol
			if in && moved != "" && pt == moved+"/nic0" && movedTook == 0 {
				movedTook = now.Sub(set)
			}
			all = all && in
		}
		if all {
			took = now.Sub(set)
		}
		return all
	})
	if err != nil {
		t.Errorf("step %s: not every VM ran at its new rate (±5%%, over 1 s) within 20 s of the ctl set", name)
		took = 20 * time.Second
	}
	line += fmt.Sprintf(" every VM at its new rate (1-s window within 5%%) %.1f s after the ctl set;", took.Seconds())
	// The agent applies the change within 1 s (the requirement).
	vm, _, _ := strings.Cut(target, "/")
	if at, ok := s.applied(s.hosts[vm], target, set); !ok || at > time.Second {
		t.Errorf("step %s: the agent of %s set no new HTB rate for %s within 1 s of the ctl set (ok %v, %v)", name, s.hosts[vm], target, ok, at)
	} else {
		line += fmt.Sprintf(" the agent of %s set %s's new HTB rate %d ms after it;", s.hosts[vm], target, at.Milliseconds())
	}
	if moved != "" {
		vms, err := s.cl.VMs(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vms {
			if v.Host != s.hosts[v.Name] {
				t.Errorf("step %s: the controller runs %s on %s, the seed on %s", name, v.Name, v.Host, s.hosts[v.Name])
			}
		}
		if movedTook == 0 {
			movedTook = 20 * time.Second
		}
		if movedTook.Seconds() > maxMoveS {
			t.Errorf("step %s: %s ran at its new rate %.1f s after the ctl set, want ≤ %.0f s", name, moved, movedTook.Seconds(), maxMoveS)
		}
		line += fmt.Sprintf(" %s moved to h2 by DRS, at its new rate %.1f s after the ctl set;", moved, movedTook.Seconds())
		// The destination's agent reports the VM: the decision is done.
		msg := ""
		if err := poll(s.ctx, 10*time.Second, func() bool {
			evs, err := s.cl.Events(s.ctx, 0)
			for _, e := range evs {
				if err == nil && e.Kind == "migrated" && e.Subject == moved {
					msg = e.Message
				}
			}
			return msg != ""
		}); err != nil {
			t.Errorf("step %s: no migrated event for %s within 10 s (h2's agent did not report it)", name, moved)
		}
		line += " controller: " + msg + ";"
	}
	line += " per 0.5 s from the set, Mbps (the agent's HTB rate at the end of each half second in brackets): " + s.trajectory(set, set.Add(took))
	settled := set.Add(took)
	return line + s.judge(name, watches, want, settled, stepWindowS)
}

// trajectory renders every port's rate in each half second from a to b.
func (s *drsRun) trajectory(a, b time.Time) string {
	var parts []string
	for _, pt := range []string{"vm1/nic0", "vm2/nic0", "vm3/nic0"} {
		var v []string
		for x := a; !x.Add(500 * time.Millisecond).After(b); x = x.Add(500 * time.Millisecond) {
			r, _ := s.rw.rate(pt, x, x.Add(500*time.Millisecond))
			vm, _, _ := strings.Cut(pt, "/")
			v = append(v, fmt.Sprintf("%.0f[%.0f]", r/1e6, s.htbAt(s.hosts[vm], pt, x.Add(500*time.Millisecond))/1e6))
		}
		parts = append(parts, pt+" "+strings.Join(v, " "))
	}
	return strings.Join(parts, "; ")
}

// hold judges that the rates stay at the last step's entitlements for d
// from `from` on.
func (s *drsRun) hold(name string, from time.Time, d time.Duration) string {
	s.t.Helper()
	p, want := s.expected()
	return name + ":" + s.judge(name, s.watch(p), want, from, int(d/time.Second))
}

func (s *drsRun) watch(p *policy.Policy) []*hostWatch {
	var ws []*hostWatch
	for _, h := range []string{"h1", "h2"} {
		if ps := s.portsOn(h); len(ps) > 0 {
			ws = append(ws, watchHost(s.t, p, h, ps, s.machine))
		}
	}
	return ws
}

// judge lets the traffic run for n seconds from `from` on (the
// measurement window), stops the watches and checks every port's median
// over the judged seconds of the window. A host needs at least 3 judged
// seconds; when the machine left fewer (other work took the CPUs), the
// window is measured again with new watches, up to three windows, and
// the judged seconds of all of them count.
func (s *drsRun) judge(name string, ws []*hostWatch, want map[string]float64, from time.Time, n int) string {
	t := s.t
	t.Helper()
	type got struct {
		judged []judgedSecond
		all    []string
		cons   livelab.Conservation
		why    []string // each window's livelab.Judgement Summary
	}
	res := map[string]got{}
	for try := 1; ; try++ {
		end := from.Add(time.Duration(n+1) * time.Second)
		time.Sleep(time.Until(end)) // the measurement window
		short := false
		for _, w := range ws {
			j, all, jm := w.judge(s.rw, from, s.usable)
			if try > 1 {
				all = append([]string{"|"}, all...) // a new window
			}
			r := res[w.host]
			r.judged, r.all = append(r.judged, j...), append(r.all, all...)
			c := jm.Conservation
			r.cons.Backlogged, r.cons.Full = r.cons.Backlogged+c.Backlogged, r.cons.Full+c.Full
			r.cons.Thin = append(r.cons.Thin, c.Thin...)
			r.why = append(r.why, jm.Summary())
			res[w.host] = r
			short = short || len(r.judged) < 3
		}
		if !short || try == 3 {
			break
		}
		t.Logf("%s: fewer than 3 judged seconds on a host; measuring another window", name)
		var nws []*hostWatch
		for _, w := range ws {
			nws = append(nws, watchHost(t, w.p, w.host, w.ports, w.machine))
		}
		ws, from = nws, time.Now()
	}
	var b strings.Builder
	for _, w := range ws {
		r := res[w.host]
		fmt.Fprintf(&b, "\n  %s (%s; per second Mbps, not judged in parentheses: %s):", w.host, strings.Join(w.ports, " "), strings.Join(r.all, " "))
		// Backlogged classes on a thin link are the scheduler's fault,
		// whatever the machine did to the other seconds.
		if v := r.cons.Verdict(s.usable); v != "" {
			t.Errorf("%s on %s: %s (per second: %s; %s)", name, w.host, v, strings.Join(r.all, " "), strings.Join(r.why, " | "))
		}
		if len(r.judged) < 3 {
			t.Errorf("%s: only %d judged seconds on %s (per second: %s; %s)", name, len(r.judged), w.host, strings.Join(r.all, " "), strings.Join(r.why, " | "))
			continue
		}
		for _, pt := range w.ports {
			var v []float64
			for _, sec := range r.judged {
				v = append(v, sec.Rates[pt])
			}
			m := median(v)
			e := relErr(m, want[pt])
			fmt.Fprintf(&b, " %s %s (entitled %s, %+.1f%%)", pt, mbps(m), mbps(want[pt]), 100*e)
			if math.Abs(e) > tol {
				t.Errorf("%s: %s median %s Mbps over %d judged seconds, entitled %s: %+.1f%% (want within 5%%)", name, pt, mbps(m), len(v), mbps(want[pt]), 100*e)
			}
		}
	}
	return b.String()
}

// startAgent runs `sluice agent --host host --controller server` (dynamic,
// the lab's inventory, the lab recorded in labDir) with its log in dir; it
// is killed at cleanup.
func startAgent(t *testing.T, dir, labDir, host, server, token, ca string) {
	t.Helper()
	startSluice(t, dir, "agent-"+host, syscall.SIGKILL, "agent", "--host", host, "--controller", server, "--token-file", token, "--ca", ca,
		"--state-dir", filepath.Join(dir, "agent-"+host), "--lab-state-dir", labDir,
		"--metrics-listen", "") // two agents on one machine: the default address is one
}

// startSluice runs the sluice binary with args until the test ends, when
// it gets sig; its output goes to dir/NAME.log, and into the test's log
// if the test failed.
func startSluice(t *testing.T, dir, name string, sig syscall.Signal, args ...string) {
	t.Helper()
	livelab.StartSluice(t, bin, dir, name, sig, args...)
}

// snapshot reads the controller's events, decisions, VMs and policy
// through `sluice ctl` (JSON).
func snapshot(t *testing.T, conn []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range []string{"events", "decisions", "vms", "policy"} {
		args := []string{"get", k}
		if k != "policy" {
			args = append(args, "-o", "json")
		}
		out[k] = ctl(t, conn, 0, args...)
	}
	var evs []json.RawMessage
	if err := json.Unmarshal([]byte(out["events"]), &evs); err != nil {
		t.Fatalf("events: %v", err)
	}
	return out
}

// eventsPrefix tells whether the events (JSON lists) before are the first
// ones of after.
func eventsPrefix(t *testing.T, before, after string) bool {
	var b, a []json.RawMessage
	if json.Unmarshal([]byte(before), &b) != nil || json.Unmarshal([]byte(after), &a) != nil {
		t.Fatalf("events are not JSON lists")
	}
	if len(a) < len(b) {
		return false
	}
	for i := range b {
		if string(a[i]) != string(b[i]) {
			return false
		}
	}
	return true
}
