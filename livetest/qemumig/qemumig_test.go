package qemumig

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/lab"
	"sluice/policy"
	"sluice/virt"
)

// migPolicy has two hosts; vm1 is a QEMU guest on h1 that can migrate.
const migPolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}]
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, nics: [{name: nic0}]}
`

// The flow: the guest's iperf3 server sends (iperf3 -R) at flowBps to a
// client in the fabric, reported every intervalS; the first migration
// starts after leadS seconds of it, and it is stopped tailS seconds after
// the last migration ended (it would end by itself after maxFlowS).
const (
	flowBps   = 150e6
	intervalS = 0.1
	leadS     = 3
	tailS     = 4
	maxFlowS  = 300
	// maxStallS is the longest stall of the flow a live migration may
	// cause: libvirt pauses the guest for its last memory pages (50–550
	// ms measured here, docs/perf/migration.md), then the guest's TCP
	// resends what was lost after its retransmission timeout (200 ms,
	// doubling per try); a longer stall means the guest was not migrated
	// live.
	maxStallS = 2.0
	// minPathBps is what the destination's uplink must carry in the
	// second after a migration to say that the flow goes through it (its
	// rate is judged from iperf3's reports, not here).
	minPathBps = 10e6
)

// TestGuestMigratesWithIperf migrates a TCG guest live with libvirt from
// lab host h1 to h2, back, and to h2 again (the machine's libvirtd runs it
// on h1 first; each destination host gets a libvirtd of its own,
// lab/migrate.go) while iperf3 in the guest sends to the fabric: with
// lab.Plan.MigrateGuest, lab.Plan.Move (the lab agent's executor) and
// virt.Pull (the libvirt agent's executor). After each migration the
// guest runs under the destination's libvirtd only; its tap is a port of
// the destination's bridge and gone from the source; its traffic leaves
// through the destination's uplink only. The iperf3 connection lasts the
// whole run (no reconnection), stalls less than maxStallS during each
// migration and the second after it, and carries at least half its rate
// after the migrations. It reports the flow's stall,
// libvirt's downtime and migration time, and each call's wall time (which
// includes the start of the destination's libvirtd the first time).
func TestGuestMigratesWithIperf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("qemumig needs root (namespaces, libvirtd)")
	}
	if _, err := os.Stat(virt.DefaultSocket); err != nil {
		t.Fatalf("libvirtd is not running (%v): run scripts/deps.sh, which installs and starts it", err)
	}
	for _, tool := range []string{"ip", "iperf3", "sockperf", "libvirtd", "nsenter", "unshare", "ldd", "dash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
	b := make([]byte, 2)
	rand.Read(b)
	cluster := "qm" + hex.EncodeToString(b)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(migPolicy, cluster)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := lab.NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Down(cluster, dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := lab.Existing(cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces: %v", left)
		}
		if left, err := lab.ExistingDomains(cluster); err != nil || len(left) > 0 {
			t.Errorf("lab down left domains: %v (%v)", left, err)
		}
		for _, h := range []string{"h1", "h2"} {
			if _, err := os.Stat(lab.HostLibvirtDir(cluster, h)); err == nil {
				t.Errorf("lab down left %s", lab.HostLibvirtDir(cluster, h))
			}
		}
	})
	t0 := time.Now()
	if _, err := lab.Up(p, lab.Options{StateDir: dir, PolicyFile: file, GuestTTL: 5 * time.Minute,
		Migratable: map[string]bool{"vm1": true}}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Logf("lab up with the guest on h1 in %v", time.Since(t0).Round(100*time.Millisecond))
	nic := pl.VM("vm1").NICs[0]

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // three migrations on a loaded machine
	defer cancel()
	fl := startFlow(t, pl.Fabric.Name, nic.IP.String(), nic.IperfPort)
	if err := fl.until(leadS, 30*time.Second); err != nil { // the flow's rate before the migrations
		t.Fatal(err)
	}
	var spans [][2]float64 // each migration's start and end, seconds into the flow
	for i, to := range []string{"h2", "h1", "h2"} {
		from := map[string]string{"h2": "h1", "h1": "h2"}[to]
		m0 := time.Now()
		var st virt.MigrationStats
		var err error
		var how string
		switch i {
		case 0:
			how = "lab.Plan.MigrateGuest"
			st, err = pl.MigrateGuest(ctx, "vm1", to)
		case 1:
			how = "lab.Plan.Move, the lab agent's executor"
			err = pl.Move("vm1", to)
		case 2:
			// The libvirt agent's executor: h2 finds the peer that runs
			// the guest (the machine's libvirtd, called h0 here, does
			// not; h1's does) and has it migrate the guest here. The
			// guest's XML is used as it is: its vNIC is on sl-br0, which
			// every lab host has.
			how = "virt.Pull, the libvirt agent's executor"
			var peer string
			peer, st, err = virt.Pull{DestURI: lab.HostLibvirtURI(cluster, to), Local: filepath.Join(lab.HostLibvirtDir(cluster, to), "run", "libvirt-sock"),
				DataURI: "unix://" + filepath.Join(lab.HostLibvirtDir(cluster, to), "migrate.sock"),
				Peers:   map[string]string{"h0": "qemu:///system", "h1": lab.HostLibvirtURI(cluster, "h1")}}.Migrate(ctx, pl.VM("vm1").Name)
			if err == nil && peer != "h1" {
				t.Errorf("virt.Pull migrated the guest from peer %q, want h1", peer)
			}
		}
		wall := time.Since(m0)
		span := [2]float64{fl.at(m0), fl.at(time.Now())}
		spans = append(spans, span)
		if err != nil {
			t.Fatalf("migrate vm1 from %s to %s: %v", from, to, err)
		}
		if st == (virt.MigrationStats{}) {
			st = completedJob(t, lab.HostLibvirtURI(cluster, to), pl.VM("vm1").Name)
		}
		t.Logf("%s → %s (%s): libvirt says %v in all, downtime %v, %d MiB sent; the call took %v; %.1f–%.1f s into the flow",
			from, to, how, virt.Duration(st.TotalMs), virt.Duration(st.DowntimeMs), st.DataBytes>>20, wall.Round(10*time.Millisecond), span[0], span[1])
		checkOn(ctx, t, pl, "vm1", to, from)
	}

	last := spans[len(spans)-1][1]
	if err := fl.until(last+tailS, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ivs, err := fl.stop()
	if err != nil {
		t.Fatal(err)
	}
	before := meanBps(ivs, 1, spans[0][0])
	after := meanBps(ivs, last+1, last+tailS)
	// A migration's stall: within the migration or the second after it.
	var stall float64
	for _, sp := range spans {
		stall = max(stall, longestStall(within(ivs, sp[0], sp[1]+1), 0.1*before))
	}
	t.Logf("iperf3 in the guest, one connection for %.1f s: %.1f Mbps before the migrations, %.1f Mbps after; longest stall during a migration or the second after it (intervals under 10%% of the rate before) %.1f s; over the whole run %.1f s",
		ivs[len(ivs)-1].End, before/1e6, after/1e6, stall, longestStall(ivs, 0.1*before))
	for i, sp := range spans {
		t.Logf("per %.1f s around migration %d (Mbps): %s", intervalS, i+1, series(ivs, sp[0]-0.5, sp[1]+0.5))
	}
	if after < 0.5*before {
		t.Errorf("after the migrations the flow carries %.1f Mbps, under half of its %.1f Mbps before", after/1e6, before/1e6)
	}
	if stall >= maxStallS {
		t.Errorf("the flow stalled %.1f s (≥ %.1f s): not a live migration", stall, maxStallS)
	}
}

// interval is one of iperf3's reports: [Start, End) seconds, Bps.
type interval struct{ Start, End, Bps float64 }

// flow is an iperf3 client in the fabric that receives from the guest's
// server (-R) and reports every intervalS (text, flushed per line).
type flow struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	ivs    []interval
	origin time.Time // the wall time of the flow's second 0
	tail   []string  // its last lines
	done   chan struct{}
	err    error // how iperf3 exited, once done is closed
}

var ivRE = regexp.MustCompile(`^\[\s*\d+\]\s+([\d.]+)-([\d.]+)\s+sec\s+[\d.]+\s+\S*Bytes\s+([\d.]+)\s+([KMG]?)bits/sec`)

func startFlow(t *testing.T, fabricNS, ip string, port int) *flow {
	t.Helper()
	f := &flow{done: make(chan struct{})}
	f.cmd = exec.Command("ip", "netns", "exec", fabricNS, "iperf3", "-c", ip, "-p", strconv.Itoa(port), "-R", "-C", "cubic",
		"-b", strconv.Itoa(int(flowBps)), "-t", strconv.Itoa(maxFlowS), "-i", fmt.Sprint(intervalS), "--forceflush")
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f.cmd.Stderr = f.cmd.Stdout
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-f.done:
		default:
			f.cmd.Process.Kill()
			<-f.done
		}
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			f.mu.Lock()
			if f.tail = append(f.tail, line); len(f.tail) > 20 {
				f.tail = f.tail[1:]
			}
			if m := ivRE.FindStringSubmatch(line); m != nil {
				var iv interval
				iv.Start, _ = strconv.ParseFloat(m[1], 64)
				iv.End, _ = strconv.ParseFloat(m[2], 64)
				iv.Bps, _ = strconv.ParseFloat(m[3], 64)
				iv.Bps *= map[string]float64{"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m[4]]
				if len(f.ivs) == 0 {
					f.origin = time.Now().Add(-time.Duration(iv.End * float64(time.Second)))
				}
				f.ivs = append(f.ivs, iv)
			}
			f.mu.Unlock()
		}
		err := f.cmd.Wait()
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		close(f.done)
	}()
	return f
}

// at is the wall time w in seconds of the flow.
func (f *flow) at(w time.Time) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return w.Sub(f.origin).Seconds()
}

// until waits until the flow has reported its second s; an error when
// iperf3 ends first or within passes.
func (f *flow) until(s float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		f.mu.Lock()
		reached := len(f.ivs) > 0 && f.ivs[len(f.ivs)-1].End >= s
		tail := strings.Join(f.tail, "\n")
		f.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-f.done:
			return fmt.Errorf("iperf3 ended before second %.1f of the flow: %v\n%s", s, f.err, tail)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the flow did not reach second %.1f within %v:\n%s", s, within, tail)
		}
	}
}

// stop ends iperf3, which must still run (one connection all along), and
// returns its intervals.
func (f *flow) stop() ([]interval, error) {
	select {
	case <-f.done:
		return nil, fmt.Errorf("iperf3 ended by itself: %v\n%s", f.err, strings.Join(f.tail, "\n"))
	default:
	}
	f.cmd.Process.Kill()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]interval(nil), f.ivs...), nil
}

// meanBps is the mean rate of the intervals within [from, to).
func meanBps(ivs []interval, from, to float64) float64 {
	var bits, secs float64
	for _, i := range ivs {
		if i.Start >= from && i.End <= to {
			bits += i.Bps * (i.End - i.Start)
			secs += i.End - i.Start
		}
	}
	if secs == 0 {
		return 0
	}
	return bits / secs
}

// within returns the intervals inside [from, to).
func within(ivs []interval, from, to float64) []interval {
	var out []interval
	for _, i := range ivs {
		if i.Start >= from && i.End <= to {
			out = append(out, i)
		}
	}
	return out
}

// longestStall is the longest run, in seconds, of consecutive intervals
// under floorBps.
func longestStall(ivs []interval, floorBps float64) float64 {
	var best, run float64
	for _, i := range ivs {
		if i.Bps < floorBps {
			run += i.End - i.Start
			best = max(best, run)
		} else {
			run = 0
		}
	}
	return best
}

func series(ivs []interval, from, to float64) string {
	var s []string
	for _, i := range ivs {
		if i.Start >= from && i.End <= to {
			s = append(s, fmt.Sprintf("%.0f", i.Bps/1e6))
		}
	}
	return strings.Join(s, " ")
}

// checkOn checks that guest vm runs on host to and no longer on from: its
// domain is active under to's libvirtd only, its tap is a port of to's
// bridge and gone from from's namespace, and over one second its traffic
// leaves through to's uplink, not from's.
func checkOn(ctx context.Context, t *testing.T, pl *lab.Plan, vm, to, from string) {
	t.Helper()
	v, dst, src := pl.VM(vm), pl.Host(to), pl.Host(from)
	nic := v.NICs[0]
	if where, err := pl.WhereIs(vm); err != nil || where != to {
		t.Errorf("the guest's tap is on host %q (%v), want %s", where, err, to)
	}
	master, _ := lab.Exec(ctx, dst.Name, "readlink", "/sys/class/net/"+nic.HostDev+"/master")
	flags, ferr := lab.Exec(ctx, dst.Name, "cat", "/sys/class/net/"+nic.HostDev+"/tun_flags")
	if filepath.Base(strings.TrimSpace(string(master))) != dst.Uplinks[0].Bridge || ferr != nil {
		t.Errorf("%s in %s: master %q, tun_flags %q (%v); want a tap on %s", nic.HostDev, dst.Name, master, flags, ferr, dst.Uplinks[0].Bridge)
	}
	if _, err := lab.Exec(ctx, src.Name, "cat", "/sys/class/net/"+nic.HostDev+"/tun_flags"); err == nil {
		t.Errorf("%s is still in %s", nic.HostDev, src.Name)
	}
	for uri, want := range map[string]bool{lab.HostLibvirtURI(pl.Cluster, to): true, lab.HostLibvirtURI(pl.Cluster, from): false, "qemu:///system": false} {
		c, err := virt.DialURI(uri)
		if err != nil && !want && uri != "qemu:///system" {
			continue // a host's own libvirtd that was never started runs nothing
		}
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Active(v.Name)
		c.Close()
		if err != nil || a != want {
			t.Errorf("%s under %s: active %v (%v), want %v", v.Name, uri, a, err, want)
			if want {
				dir := lab.HostLibvirtDir(pl.Cluster, to)
				t.Logf("%s's QEMU log: %s", to, fileTail(filepath.Join(dir, "log", "qemu", v.Name+".log"), 2000))
				t.Logf("%s's libvirtd log: %s", to, fileTail(filepath.Join(dir, "libvirtd.log"), 2000))
			}
		}
	}
	tx := func(h *lab.HostPlan) float64 {
		b, err := lab.Exec(ctx, h.Name, "cat", "/sys/class/net/"+h.Uplinks[0].Dev+"/statistics/tx_bytes")
		if err != nil {
			t.Fatalf("tx_bytes of %s in %s: %v", h.Uplinks[0].Dev, h.Name, err)
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		return v
	}
	a1, a2 := tx(src), tx(dst)
	time.Sleep(time.Second) // a counting window, not a synchronization
	d1, d2 := 8*(tx(src)-a1), 8*(tx(dst)-a2)
	t.Logf("uplinks over 1 s after the migration: %s %.1f Mbps, %s %.1f Mbps", from, d1/1e6, to, d2/1e6)
	if d2 < minPathBps || d1 > 0.01*d2 {
		t.Errorf("after the migration %s's uplink sent %.1f Mbps and %s's %.1f Mbps; want the guest's flow through %s's only (at least %.0f Mbps there, under 1%% of that on %s's)", from, d1/1e6, to, d2/1e6, to, minPathBps/1e6, from)
	}
}

// completedJob reads libvirt's statistics of the domain's incoming
// migration from the destination's libvirtd.
func completedJob(t *testing.T, uri, name string) virt.MigrationStats {
	t.Helper()
	c, err := virt.DialURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.CompletedJob(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fileTail is the last n bytes of a file, or why it cannot be read.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return fmt.Sprintf("%s: %q", path, b)
}
