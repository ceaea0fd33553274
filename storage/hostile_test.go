package storage

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sluice/internal/nbdattack"
)

// hostilePolicy: two VMs with equal shares on one host; the datastore is a
// directory on tmpfs (memory speed), so the gateway's CPU, not the
// datastore, is what the VMs compete for.
const hostilePolicy = `
cluster: hx
hosts:
  - name: h1
    cpu: {cores: 4, mhz: 2000}
    memory: 16GiB
    uplinks: [{name: vmnic0, speed: 10Gbps}]
datastores:
  - name: ds1
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, shares: 1000, size: 64MiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, shares: 1000, size: 64MiB}]}
`

// gwHostileEnv makes the test binary the gateway of the hostile-client
// tests: it serves hostilePolicy's VM sockets in $DIR/socks from the
// directory datastore $DIR/ds until its stdin closes.
const gwHostileEnv = "SLUICE_GW_HOSTILE"

func runGatewayHostileChild(t *testing.T, dir string) {
	p := parsePolicy(t, hostilePolicy)
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": filepath.Join(dir, "ds")}, Period: time.Hour})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serveVMSockets(t, g, filepath.Join(dir, "socks"), DefaultSocketPerm)
	_, _ = io.Copy(io.Discard, os.Stdin)
	g.Close()
	os.Exit(0)
}

// startHostileGateway runs the gateway of hostilePolicy in a child process
// with GOMAXPROCS=1 (sluice gateway's default --cpus 1) and returns its
// socket directory once both VMs' sockets exist.
func startHostileGateway(t *testing.T, testName string) string {
	t.Helper()
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = ""
	}
	dir, err := os.MkdirTemp(base, "sluice-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Mkdir(filepath.Join(dir, "ds"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateVolumes(filepath.Join(dir, "ds"), parsePolicy(t, hostilePolicy), "ds1"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+testName+"$")
	cmd.Env = append(os.Environ(), gwHostileEnv+"="+dir, "GOMAXPROCS=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	socks := filepath.Join(dir, "socks")
	waitVMSockets(t, socks, []string{"vm1", "vm2"})
	return socks
}

// waitVMSockets waits until a gateway in a child process has made each
// VM's socket in dir, for at most 20 s.
func waitVMSockets(t *testing.T, dir string, vms []string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, vm := range vms {
		for {
			if _, err := os.Lstat(VMSocket(dir, vm)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no socket for %s after 20 s", vm)
			}
			time.Sleep(10 * time.Millisecond) // polling a child process, with a deadline
		}
	}
}

// victimIOPS runs fio (4 KiB random reads, queue depth 16) on vm2's disk
// through its socket for secs seconds after a 500 ms ramp (an attack has
// begun before it: an attacker's connections pipeline within
// milliseconds).
func victimIOPS(t *testing.T, socks string, secs int) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	uri := "nbd+unix:///vm2/d0?socket=" + VMSocket(socks, "vm2")
	res, err := runFio(ctx, t, []string{"time_based", "ramp_time=500ms", fmt.Sprintf("runtime=%d", secs), "size=64M"},
		[]fioJob{{name: "vm2", uri: uri, rw: "randread", bs: "4k", iodepth: 16}})
	if err != nil {
		t.Fatal(err)
	}
	expectNoFioErrors(t, res)
	return res["vm2"].IOPS
}

// hostileResult is what vm2 kept under one attack: per round its IOPS
// under the attack over the mean of its IOPS alone just before and after
// (the machine's load drifts; adjacent runs see the same), and the
// attacker's replies per second.
type hostileResult struct {
	attack  nbdattack.Attack
	shares  []float64
	hostile []float64
}

// measureHostile runs vm2 alone and under each attack by vm1 in turn,
// rounds times over: alone, attack 1, alone, attack 2, alone, ...
func measureHostile(t *testing.T, socks string, secs, rounds int) []hostileResult {
	// The attacker is a VM with one vCPU: on a 2-CPU machine a client
	// using both would take the CPUs of fio and of the gateway, whatever
	// the gateway does.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	res := make([]hostileResult, len(nbdattack.Attacks))
	prev := victimIOPS(t, socks, secs)
	for r := 0; r < rounds; r++ {
		for i, a := range nbdattack.Attacks {
			ctx, cancel := context.WithCancel(context.Background())
			replies, wait, err := nbdattack.Run(ctx, VMSocket(socks, "vm1"), "vm1/d0", 64<<20, a)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			start := time.Now()
			v := victimIOPS(t, socks, secs)
			n := replies.Load()
			el := time.Since(start)
			cancel()
			wait()
			next := victimIOPS(t, socks, secs)
			alone := (prev + next) / 2
			t.Logf("round %d, vm1 %s: vm2 %.0f IOPS, alone %.0f and %.0f: %.0f%%", r+1, a.Name, v, prev, next, 100*v/alone)
			res[i].attack = a
			res[i].shares = append(res[i].shares, v/alone)
			res[i].hostile = append(res[i].hostile, float64(n)/el.Seconds())
			prev = next
		}
	}
	return res
}

// minVictimShare is the fraction of its alone IOPS vm2 keeps under each
// attack by vm1 (TestLiveHostileVM). Measured on the 2-CPU test machine at
// load 5–8 (docs/performance.md), medians of three rounds: before the
// fair-service rules 7–23%; after, in seven runs, 45–74% under valid READs,
// 63–135% under invalid ones on one connection and 32–82% on four (32%
// once, 59% or more otherwise). Run-to-run noise here is ±20 points; 0.3
// is below every figure after and above every figure before.
const minVictimShare = 0.3

// A hostile vm1 pipelining 256 requests per connection (valid READs on
// one connection, invalid READs on one and on four) on its own socket,
// while vm2 (equal shares) runs fio 4 KiB random reads at queue depth 16
// on its socket: the gateway (a child process, GOMAXPROCS=1 as with
// --cpus 1, datastore on tmpfs) keeps vm2 at ≥ minVictimShare of its
// IOPS alone, measured alone in the same run just before and after each
// attack run; the median of three rounds is judged. With equal shares and
// the gateway's CPU the bottleneck, the fair outcome is about half.
func TestLiveHostileVM(t *testing.T) {
	if dir := os.Getenv(gwHostileEnv); dir != "" {
		runGatewayHostileChild(t, dir)
	}
	needTools(t, "fio")
	socks := startHostileGateway(t, "TestLiveHostileVM")
	res := measureHostile(t, socks, 2, 3)
	for _, r := range res {
		med := median(r.shares)
		t.Logf("vm1 %s: vm2 kept a median %.0f%% of its IOPS alone (rounds: %s); vm1 got a median %.0f replies/s",
			r.attack.Name, 100*med, percents(r.shares), median(r.hostile))
		if med < minVictimShare {
			t.Errorf("vm1 %s: vm2 kept a median %.0f%% of its IOPS alone; want ≥ %.0f%%", r.attack.Name, 100*med, 100*minVictimShare)
		}
	}
}

// percents formats fractions as "12% 34% ...".
func percents(v []float64) string {
	var b strings.Builder
	for i, x := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.0f%%", 100*x)
	}
	return b.String()
}
