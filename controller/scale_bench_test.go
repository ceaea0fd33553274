package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/entitle"
	"sluice/internal/cputime"
	"sluice/placement"
)

// scalePolicy is a cluster of hosts hosts (one 25 GbE uplink each) and
// vms VMs, VM i on host i/(vms/hosts), each with one vNIC; every tenth
// vNIC reserves 100 Mbps. The fewest fields that say this, in block
// style: 1,000 hosts and 30,000 VMs come to ~193,000 values, just under
// the policy's limit (policy.MaxNodes, 200,000).
func scalePolicy(hosts, vms int) []byte {
	var b strings.Builder
	b.WriteString("cluster: scale\nreservationCap: 0.75\nhosts:\n")
	for h := 0; h < hosts; h++ {
		fmt.Fprintf(&b, "  - {name: h%04d, uplinks: [{name: vmnic0, speed: 25Gbps}]}\n", h)
	}
	b.WriteString("trafficClasses:\n  vm: {shares: normal}\nvms:\n")
	per := max(vms/hosts, 1)
	for i := 0; i < vms; i++ {
		fmt.Fprintf(&b, "  - name: vm%05d\n    host: h%04d\n    nics:\n      - name: nic0\n", i, min(i/per, hosts-1))
		if i%10 == 0 {
			b.WriteString("        reservation: 100Mbps\n")
		}
	}
	return []byte(b.String())
}

// scaleVMsOn are the VMs scalePolicy(hosts, vms) places on host index h,
// in name order: what a real agent reports as running there.
func scaleVMsOn(h, hosts, vms int) []string {
	per := max(vms/hosts, 1)
	var out []string
	for i := 0; i < vms; i++ {
		if min(i/per, hosts-1) == h {
			out = append(out, fmt.Sprintf("vm%05d", i))
		}
	}
	return out
}

func envInt(name string, dflt int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return dflt
}

// procStatus returns a field of /proc/PID/status in MiB (VmRSS, VmHWM).
func procStatus(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return -1
}

// procCPU is the user and system CPU time of process pid so far.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command (in parentheses): utime and stime are
	// the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// simAgent is a simulated agent's watch: it long-polls its host's
// desired state through the API, as controller.Follower does, and notes
// when each new revision arrived.
// fromHost makes cl connect from a loopback address of agent i's own
// (127.1.X.Y): the agents of a real cluster come from their hosts'
// addresses, and the API holds at most MaxConnsPerIP connections from
// one address.
func fromHost(cl *Client, i int) {
	ip := net.IPv4(127, 1, byte(i/250), byte(i%250+1))
	cl.HTTP.Transport.(*http.Transport).DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext
}

type simAgent struct {
	host string
	vms  []string // the VMs its hypervisor runs (the scale policy places them there)
	cl   *Client
	mu   sync.Mutex
	rev  int64
	at   time.Time
	d    DesiredHost
}

func (a *simAgent) run(ctx context.Context, first *atomic.Int64) {
	for ctx.Err() == nil {
		a.mu.Lock()
		rev := a.rev
		a.mu.Unlock()
		d, err := a.cl.WatchDesired(ctx, a.host, rev, 30*time.Second)
		if err != nil {
			if ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		if d.Revision > rev {
			a.mu.Lock()
			a.rev, a.at, a.d = d.Revision, time.Now(), d
			a.mu.Unlock()
			if rev == 0 {
				first.Add(1)
			}
		}
	}
}

// vnicR is port's reservation in d, or -1.
func vnicR(d DesiredHost, port string) float64 {
	for _, u := range d.Uplinks {
		for _, c := range u.Classes {
			for _, v := range c.VNICs {
				if v.Port == port {
					return v.ReservationBps
				}
			}
		}
	}
	return -1
}

// rateAgent is the affected host's agent behind controller.Follower: it
// computes its ports' rates from each desired state it is handed.
type rateAgent struct {
	port string
	mu   sync.Mutex
	r    float64 // the port's reservation in the last state handed
	rate float64 // its entitlement (every demand unbounded)
	at   time.Time
	vms  []string
}

func (a *rateAgent) Apply(d DesiredHost) error {
	// As the agent does: the host's part, derived with its VMs running.
	live := entitle.Live{Hosts: map[string]string{}}
	for _, vm := range d.Policy.VMs {
		live.Hosts[vm.Name] = d.Host
	}
	n := entitle.NewNet(entitle.Derive(d.Policy, live))
	n.Compute()
	rate := -1.0
	if ps := n.Port(a.port); len(ps) > 0 {
		rate = ps[0].AllocBps()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.r, a.rate, a.at, a.vms = vnicR(d, a.port), rate, time.Now(), d.VMs
	return nil
}

func (a *rateAgent) Report() Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Report{VMs: a.vms, Uplinks: []string{"vmnic0"}}
}

func poll(within time.Duration, ok func() bool) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return false
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkScale runs the real `sluice controller` (embedded etcd, fsync
// on) with SLUICE_SCALE_HOSTS simulated agents (default 1,000, each with
// its host's token) and a policy of SLUICE_SCALE_VMS VMs (default
// 30,000), and times what an
// operator waits for: the agents registering, `sluice ctl apply` of the
// whole policy, every agent's watch getting its host's desired state,
// and from `sluice ctl set` of one vNIC to its agent computing the new
// rates (controller.Follower through the real watch). It reports the
// controller process's memory (RSS now and peak). Run it once:
//
//	go test -run '^$' -bench Scale -benchtime=1x ./controller
//
// (bench/controller.sh prints it as a table). SLUICE_BIN names a sluice
// binary to measure instead of building one.
func BenchmarkScale(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	sets := envInt("SLUICE_SCALE_SETS", 5)
	tmp := b.TempDir()
	bin := sluiceBin(b, tmp)
	polFile := filepath.Join(tmp, "scale.yaml")
	if err := os.WriteFile(polFile, scalePolicy(nh, nv), 0o600); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(polFile)

	// The controller, with a token for each host's agent (as a cluster
	// should run, docs/deploy.md): each agent's requests are then its
	// host's flow in the hosts' seats, not one operator's flow.
	hostTokens := scaleTokens(b, filepath.Join(tmp, "data"), nh)
	rc := startController(b, bin, tmp, "--drs-interval", "0", "--host-ttl", "60")
	defer rc.stop()
	pid, server, dir, stderr := rc.pid, rc.server, rc.dir, rc.stderr
	rssIdle := procStatus(pid, "VmRSS")
	ctl := func(args ...string) (string, time.Duration) {
		start := time.Now()
		out, err := exec.Command(bin, append([]string{"ctl", "--server", server, "--data-dir", dir}, args...)...).CombinedOutput()
		took := time.Since(start)
		if err != nil {
			se, _ := os.ReadFile(stderr)
			b.Fatalf("sluice ctl %s: %v\n%s\ncontroller's stderr:\n%s", strings.Join(args, " "), err, out, se)
		}
		return string(out), took
	}
	ca := filepath.Join(dir, "tls", "cert.pem")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// 1. The agents register (no policy yet), each on its own connection.
	agents := make([]*simAgent, nh)
	for i := range agents {
		cl, err := NewClient(server, hostTokens[i], ca)
		if err != nil {
			b.Fatal(err)
		}
		fromHost(cl, i)
		agents[i] = &simAgent{host: fmt.Sprintf("h%04d", i), vms: scaleVMsOn(i, nh, nv), cl: cl}
	}
	// register registers every agent at once; like controller.Follower, an
	// agent whose request fails tries again after a second. It returns
	// when all are registered, and how many requests failed.
	register := func() (time.Duration, int64) {
		start := time.Now()
		var wg sync.WaitGroup
		var failed atomic.Int64
		var firstErr atomic.Value
		for _, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < 10*time.Minute {
					if _, err := a.cl.Register(ctx, a.host, Report{Uplinks: []string{"vmnic0"}, VMs: a.vms}); err == nil {
						return
					} else {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
					time.Sleep(time.Second)
				}
			}()
		}
		wg.Wait()
		if e := firstErr.Load(); e != nil {
			progress("%d failed registration requests (retried), the first: %v", failed.Load(), e)
		}
		if time.Since(start) >= 10*time.Minute {
			b.Fatalf("agents not all registered after 10 min")
		}
		return time.Since(start), failed.Load()
	}
	cpu0 := procCPU(pid)
	regEmpty, _ := register()
	cpuReg := procCPU(pid) - cpu0
	progress("%d agents registered in %v", nh, regEmpty)
	var first atomic.Int64
	for _, a := range agents {
		go a.run(ctx, &first)
	}

	// 2. The whole policy, and every agent's watch getting its host's state.
	cpu0 = procCPU(pid)
	applyStart := time.Now()
	_, applyTook := ctl("apply", "-f", polFile)
	if !poll(10*time.Minute, func() bool { return first.Load() == int64(nh) }) {
		b.Fatalf("after 10 min only %d of %d agents got their desired state", first.Load(), nh)
	}
	var arrived []time.Duration
	for _, a := range agents {
		a.mu.Lock()
		arrived = append(arrived, a.at.Sub(applyStart))
		a.mu.Unlock()
	}
	allDesired, halfDesired := slicesMax(arrived), median(arrived)
	cpuApply := procCPU(pid) - cpu0
	progress("apply %v; all %d agents had their desired state %v after its start", applyTook, nh, allDesired)
	rssApply, hwmApply := procStatus(pid, "VmRSS"), procStatus(pid, "VmHWM")

	// 3. One vNIC's reservation set, again and again: ctl's wall time, the
	// host's watch, and the Follower of the host computing the new rates.
	vm := nv / 2
	per := max(nv/nh, 1)
	host, portName := fmt.Sprintf("h%04d", min(vm/per, nh-1)), fmt.Sprintf("vm%05d/nic0", vm)
	ra := &rateAgent{port: portName, r: -1}
	fcl, _ := NewClient(server, hostTokens[min(vm/per, nh-1)], ca)
	fol := &Follower{Client: fcl, Host: host, Agent: ra, RetryEvery: 100 * time.Millisecond}
	fctx, fcancel := context.WithCancel(ctx)
	folDone := make(chan struct{})
	go func() { defer close(folDone); fol.Run(fctx) }()
	defer func() { fcancel(); <-folDone }()
	folStart := time.Now()
	if !poll(5*time.Minute, func() bool { ra.mu.Lock(); defer ra.mu.Unlock(); return ra.r >= 0 }) {
		b.Fatalf("the follower of %s got no desired state in 5 min", host)
	}
	folFirst := time.Since(folStart)
	progress("the follower of %s had its first desired state in %v", host, folFirst)
	var watched *simAgent
	for _, a := range agents {
		if a.host == host {
			watched = a
		}
	}
	var tCtl, tWatch, tAgent, cpuSet []time.Duration
	var rate float64
	cpu0 = procCPU(pid)
	for s := 0; s < sets; s++ {
		cpuS := procCPU(pid)
		want := float64(200+100*(s%2)) * 1e6
		start := time.Now()
		out, took := ctl("set", portName, fmt.Sprintf("reservation=%gMbps", want/1e6), "--reason", "bench")
		if !strings.Contains(out, portName+" gets") {
			b.Fatalf("set: %s", out)
		}
		if !poll(5*time.Minute, func() bool { a := watched; a.mu.Lock(); defer a.mu.Unlock(); return vnicR(a.d, portName) == want }) {
			b.Fatalf("the watch of %s did not get %s R=%g", host, portName, want)
		}
		watched.mu.Lock()
		tWatch = append(tWatch, watched.at.Sub(start))
		watched.mu.Unlock()
		if !poll(5*time.Minute, func() bool { ra.mu.Lock(); defer ra.mu.Unlock(); return ra.r == want }) {
			b.Fatalf("the follower of %s did not get %s R=%g", host, portName, want)
		}
		ra.mu.Lock()
		tAgent, rate = append(tAgent, ra.at.Sub(start)), ra.rate
		ra.mu.Unlock()
		tCtl, cpuSet = append(tCtl, took), append(cpuSet, procCPU(pid)-cpuS)
		progress("set %d: ctl %v, watch %v, agent %v, controller CPU %v", s, took, tWatch[s], tAgent[s], cpuSet[s])
	}

	// 4. Every agent registers again (as after an outage longer than the TTL).
	cpuSets := (procCPU(pid) - cpu0) / time.Duration(sets)
	cpu0 = procCPU(pid)
	regFull, regFailed := register()
	cpuReg2 := procCPU(pid) - cpu0
	progress("%d agents registered again in %v (%d failed requests retried)", nh, regFull, regFailed)
	_, getVMs := ctl("get", "vms", "-o", "json")
	_, getHosts := ctl("get", "hosts", "-o", "json")
	rss, hwm := procStatus(pid, "VmRSS"), procStatus(pid, "VmHWM")
	db, _ := os.Stat(filepath.Join(dir, "etcd", "member-data", "member", "snap", "db"))
	var dbMiB float64
	if db != nil {
		dbMiB = float64(db.Size()) / (1 << 20)
	}

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(applyTook), "apply-ms")
	b.ReportMetric(ms(allDesired), "all-desired-ms")
	b.ReportMetric(ms(median(tCtl)), "set-ctl-ms")
	b.ReportMetric(ms(median(tWatch)), "set-watch-ms")
	b.ReportMetric(ms(median(tAgent)), "set-agent-ms")
	b.ReportMetric(ms(median(cpuSet)), "set-cpu-ms")
	b.ReportMetric(ms(regFull), "register-all-ms")
	b.ReportMetric(hwm, "peak-rss-MiB")
	var t strings.Builder
	fmt.Fprintf(&t, "controller scale: %d hosts, %d VMs (%d vNICs, %.1f MiB of policy YAML), embedded etcd (fsync on), %d CPUs, sluice %s\n",
		nh, nv, nv, float64(fi.Size())/(1<<20), runtime.NumCPU(), bin)
	c := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	fmt.Fprintf(&t, "| step | wall time | controller CPU |\n| --- | --- | --- |\n")
	fmt.Fprintf(&t, "| %d agents register, no policy yet (all at once, one TLS connection and host token each) | %v | %s |\n", nh, regEmpty.Round(time.Millisecond), c(cpuReg))
	fmt.Fprintf(&t, "| `sluice ctl apply -f` of the whole policy (process wall time) | %v | |\n", applyTook.Round(time.Millisecond))
	fmt.Fprintf(&t, "| from the apply's start to the last of %d agents' watches having its host's desired state (median agent: %v) | %v | %s (apply and all watches) |\n", nh, halfDesired.Round(time.Millisecond), allDesired.Round(time.Millisecond), c(cpuApply))
	fmt.Fprintf(&t, "| a Follower's first desired state (registers, watches, fetches and rebuilds the policy) | %v | |\n", folFirst.Round(time.Millisecond))
	fmt.Fprintf(&t, "| `sluice ctl set %s reservation=…` (wall time; median of %d, max %v) | %v | %s per set (median; mean %s, with the agents' reports and reads) |\n", portName, sets, slicesMax(tCtl).Round(time.Millisecond), median(tCtl).Round(time.Millisecond), c(median(cpuSet)), c(cpuSets))
	fmt.Fprintf(&t, "| from the set's start to %s's watch returning the new state (median, max %v) | %v | |\n", host, slicesMax(tWatch).Round(time.Millisecond), median(tWatch).Round(time.Millisecond))
	fmt.Fprintf(&t, "| from the set's start to %s's agent (Follower) having computed the new rates (median, max %v; %s gets %s) | %v | |\n", host, slicesMax(tAgent).Round(time.Millisecond), portName, entitle.FormatBps(rate), median(tAgent).Round(time.Millisecond))
	fmt.Fprintf(&t, "| %d agents register again with the policy in force (all at once; %d requests failed and were retried) | %v | %s |\n", nh, regFailed, regFull.Round(time.Millisecond), c(cpuReg2))
	fmt.Fprintf(&t, "| `sluice ctl get vms -o json` / `get hosts -o json` | %v / %v | |\n", getVMs.Round(time.Millisecond), getHosts.Round(time.Millisecond))
	fmt.Fprintf(&t, "| controller RSS (with its etcd): idle / after apply / at the end / peak | %.0f / %.0f / %.0f / %.0f MiB (peak after apply %.0f) | |\n", rssIdle, rssApply, rss, hwm, hwmApply)
	fmt.Fprintf(&t, "| etcd's db file at the end | %.1f MiB | |\n", dbMiB)
	fmt.Print(t.String()) // b.Logf truncates a benchmark's log
}

// scaleTokens writes the tokens file of the controller's data directory
// dir: an operator's token first (the one sluice ctl reads), then one
// token per host h0000, h0001, ...; it returns the hosts' tokens.
func scaleTokens(b *testing.B, dir string, hosts int) []string {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	op := make([]byte, 32)
	if _, err := rand.Read(op); err != nil {
		b.Fatal(err)
	}
	lines := []string{hex.EncodeToString(op)}
	toks := make([]string, hosts)
	for i := range toks {
		l, err := NewHostToken(fmt.Sprintf("h%04d", i))
		if err != nil {
			b.Fatal(err)
		}
		lines, toks[i] = append(lines, l), strings.Fields(l)[0]
	}
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	return toks
}

// progress prints a step's result as it comes (the table is printed at the end).
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...)
}

func slicesMax(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// scaleController is a controller on the package's etcd (fsync off) with
// the scale policy applied in process.
func scaleController(b *testing.B, nh, nv int) *Controller {
	c := New(Config{Client: testEtcd.Client, Prefix: fmt.Sprintf("/bench/%s/%d/", b.Name(), time.Now().UnixNano())})
	if _, err := c.Apply(context.Background(), ApplyRequest{File: "scale.yaml", Document: string(scalePolicy(nh, nv))}); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkSetInProcess is one `set` of a vNIC's reservation, in process
// (no HTTP), on SLUICE_SCALE_HOSTS × SLUICE_SCALE_VMS (default 1,000 ×
// 30,000): what the controller computes and writes for it. Besides wall
// time it reports the process's CPU time per set (cpu-ms/op: the
// controller's and its embedded etcd's, garbage collection included),
// which a loaded machine does not inflate.
func BenchmarkSetInProcess(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	c := scaleController(b, nh, nv)
	port := fmt.Sprintf("vm%05d/nic0", nv/2)
	runtime.GC()
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		if _, err := c.Set(context.Background(), SetRequest{Changes: []string{fmt.Sprintf("%s.reservation=%dMbps", port, 200+100*(i%2))}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/1e6/float64(b.N), "cpu-ms/op")
}

// BenchmarkSetDecide is the decision of the same set alone (view.set: the
// change's refusals, the faults it brings, the port's new rate), without
// reading or writing the state.
func BenchmarkSetDecide(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	c := scaleController(b, nh, nv)
	ctx := context.Background()
	st, err := c.load(ctx)
	if err != nil {
		b.Fatal(err)
	}
	reports, err := c.reports(ctx)
	if err != nil {
		b.Fatal(err)
	}
	v := c.viewOf(st, reports)
	port := fmt.Sprintf("vm%05d/nic0", nv/2)
	runtime.GC()
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		ch, err := placement.ParseChange(fmt.Sprintf("%s.reservation=%dMbps", port, 200+100*(i%2)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.set([]placement.Change{ch}, "", c.cfg.DRS); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/1e6/float64(b.N), "cpu-ms/op")
}

// BenchmarkRegisterInProcess is one agent's registration, in process, on
// SLUICE_SCALE_HOSTS × SLUICE_SCALE_VMS with the policy in force.
func BenchmarkRegisterInProcess(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	c := scaleController(b, nh, nv)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Register(context.Background(), fmt.Sprintf("h%04d", i%nh), Report{Uplinks: []string{"vmnic0"}, VMs: scaleVMsOn(i%nh, nh, nv)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFollowerDesired is what an agent does with a new desired state
// of its host on SLUICE_SCALE_HOSTS × SLUICE_SCALE_VMS: decode it (the
// host's part of the policy with what it derives to) and derive the
// host's trees from the part, as the agent does with its VMs running.
func BenchmarkFollowerDesired(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	c := scaleController(b, nh, nv)
	ctx := context.Background()
	if _, err := c.Set(ctx, SetRequest{Changes: []string{"vm00007/nic0.reservation=200Mbps"}}); err != nil {
		b.Fatal(err)
	}
	host := fmt.Sprintf("h%04d", min(7/max(nv/nh, 1), nh-1)) // vm00007's
	d, err := c.WatchDesired(ctx, host, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	wire, _ := json.Marshal(d)
	b.SetBytes(int64(len(wire)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var got DesiredHost
		if err := json.Unmarshal(wire, &got); err != nil {
			b.Fatal(err)
		}
		live := entitle.Live{Hosts: map[string]string{}}
		for _, vm := range got.Policy.VMs {
			live.Hosts[vm.Name] = host
		}
		if len(entitle.Derive(got.Policy, live).HostUplinks(host)) == 0 {
			b.Fatal("no uplink derived")
		}
	}
}

// BenchmarkRegisterAllInProcess is every agent of SLUICE_SCALE_HOSTS ×
// SLUICE_SCALE_VMS registering again at once (one goroutine each), in
// process, with the policy in force and each host's VMs running: the
// re-registration after a controller restart, without TLS and HTTP. It
// reports the wall time of all and the process's CPU time.
func BenchmarkRegisterAllInProcess(b *testing.B) {
	nh, nv := envInt("SLUICE_SCALE_HOSTS", 1000), envInt("SLUICE_SCALE_VMS", 30000)
	c := scaleController(b, nh, nv)
	ctx := context.Background()
	register := func() {
		var wg sync.WaitGroup
		for h := range nh {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Register(ctx, fmt.Sprintf("h%04d", h), Report{Uplinks: []string{"vmnic0"}, VMs: scaleVMsOn(h, nh, nv)}); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	register() // every host's VMs observed running once
	runtime.GC()
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for i := 0; i < b.N; i++ {
		register()
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/1e6/float64(b.N), "cpu-ms/op")
}
