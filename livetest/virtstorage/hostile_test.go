//go:build hostileguest

package virtstorage

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/internal/nbdattack"
	"sluice/internal/testcert"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/storage"
)

// hostilePolicy: vm2 a QEMU guest and vm1 a VM whose QEMU is hostile (the
// test's attacker on vm1's socket), equal shares, on one host; the
// datastore serves at memory speed (no delay, a rate far above what the
// gateway can do), so that the gateway's CPU is what both VMs' I/O needs.
const hostilePolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    array: {slots: 256, serviceTime: 200us}
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: ds1, size: 64MiB, shares: 1000}]}
  - {name: vm2, host: h1, lab: {kind: qemu}, disks: [{name: d0, datastore: ds1, size: 64MiB, shares: 1000, reservationIOPS: %d}]}
`

// minGuestShare is the fraction of its IOPS alone that a guest keeps while
// another VM on its host attacks the gateway (issue 24's bound).
const minGuestShare = 0.8

// guestReservation is vm2's disk reservation: under every attack each
// second of vm2's fio stays at or above it.
const guestReservation = 2000

// TestGuestHostileVM: a QEMU guest (vm2) runs fio (4 KiB random reads,
// direct I/O, queue depth 16) on its gateway disk while vm1's "QEMU", the
// test's hostile client, pipelines 256 requests per connection on vm1's
// socket (valid READs on one connection, invalid READs on one and on
// four), and while 600 idle TCP connections flood the gateway's TLS
// listener (issue 24's attacks). vm2 keeps ≥ minGuestShare of its IOPS alone, measured alone
// just before and after each attack run (the median of three rounds is
// judged, for each attack), and every whole second of its fio under an
// attack stays at or above its disk's reservation.
//
// The guest's QEMU runs on CPU 0; the gateway, the datastore (nbdkit, at
// nice −10) and the attacker (a child process at SCHED_IDLE) on CPU 1
// (sched_setaffinity, chrt, renice). On a real host each VM's vCPUs, the
// gateway (`--cpus`) and the datastore (another machine) do not wait for
// each other's CPU; on this 2-CPU machine, sharing the CPUs as equals, the
// attacker would take the gateway's CPU and the datastore the guest's,
// whatever the gateway does (docs/performance.md). The gateway's CPU time
// under each attack is logged; what vm2 keeps is what the gateway's turns
// give it. An attacker that runs only when the gateway waits does not
// keep the gateway's CPU busy (40–65% of a CPU here): the saturated case
// is TestLiveHostileVM's (package storage).
func TestGuestHostileVM(t *testing.T) {
	if spec := os.Getenv(attackerEnv); spec != "" {
		runAttacker(spec)
	}
	if runtime.NumCPU() < 2 {
		t.Fatalf("needs 2 CPUs (the guest on one, the gateway and the attacker on the other); this machine has %d", runtime.NumCPU())
	}
	for _, tool := range []string{"taskset", "chrt", "renice"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s (util-linux)", tool)
		}
	}
	const secs, rounds = 4, 3
	nAttacks := len(nbdattack.Attacks) + 1 // and the connection flood
	guestTTL = time.Duration(rounds*nAttacks*2*(secs+15)+240) * time.Second
	gateway := sluiceBin
	if b := os.Getenv("SLUICE_GATEWAY_BIN"); b != "" { // bench/storage-hostile-guest.sh: another revision's gateway
		gateway = b
	}
	// The gateway also listens for TLS clients in its host's namespace,
	// for the connection flood.
	tlsDir := t.TempDir()
	ca, err := testcert.NewCA("sluice test CA")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(tlsDir, "server", sp); err != nil {
		t.Fatal(err)
	}
	tlsArgs := []string{"--listen", floodAddr, "--tls-cert", filepath.Join(tlsDir, "server-cert.pem"),
		"--tls-key", filepath.Join(tlsDir, "server-key.pem"), "--tls-ca", filepath.Join(tlsDir, "ca-cert.pem")}
	l := &guestLab{livelab.UpGuestLab(t, "vsh", fmt.Sprintf(hostilePolicy, "%s", guestReservation),
		lab.Options{Gateway: gateway, GatewayArgs: tlsArgs, GuestTTL: guestTTL})}
	ctx, cancel := context.WithTimeout(context.Background(), guestTTL)
	defer cancel()

	gw := l.process("gateway:h1")
	qemu, err := lab.GuestPID(*l.Plan.VM("vm2"))
	if err != nil {
		t.Fatal(err)
	}
	pin(t, qemu, "0")
	pin(t, gw.PID, "1")
	ds := l.process("nbdkit:ds1").PID
	pin(t, ds, "1")
	if out, err := exec.Command("renice", "-n", "-10", "-p", strconv.Itoa(ds)).CombinedOutput(); err != nil {
		t.Fatalf("renice the datastore: %v: %s", err, out)
	}
	sock := storage.VMSocket(storage.SocketDir(l.P.Cluster, "h1"), "vm1")

	// fio returns vm2's IOPS over its run and the least of its whole
	// seconds (fio's IOPS log; the seconds after the ramp).
	fio := func() (iops, least float64) {
		t.Helper()
		f := l.GuestFio(ctx, "vm2", "name=r", "filename=/dev/vda", "direct=1", "ioengine=libaio", "iodepth=16",
			"rw=randread", "bs=4k", "size=64M", "time_based", "ramp_time=1", "runtime="+strconv.Itoa(secs),
			"write_iops_log=/tmp/vm2", "log_avg_msec=1000")
		if f.Err != nil || f.JobError != 0 {
			t.Fatalf("fio in vm2: %v %s", f.Err, tail(f.Stderr, 5))
		}
		r, err := lab.GuestExec(ctx, l.P.Cluster, "vm2", "/bin/cat", "/tmp/vm2_iops.1.log")
		if err != nil {
			t.Fatalf("fio's IOPS log in vm2: %v", err)
		}
		es, err := livelab.ParseFioLog(r.Stdout)
		if err != nil {
			t.Fatalf("fio's IOPS log in vm2: %v", err)
		}
		least = math.Inf(1)
		for _, e := range es {
			if e.Msec <= int64(secs)*1000 {
				least = math.Min(least, float64(e.Value))
			}
		}
		if math.IsInf(least, 1) {
			t.Fatalf("fio's IOPS log in vm2 has no whole second: %q", r.Stdout)
		}
		return f.ReadIOPS, least
	}
	// vm1's NBD attacks on its socket, and 600 idle TCP connections on
	// the gateway's TLS listener from six addresses, each opened again
	// 1 s after the gateway closed it (issue 24's flood).
	// An NBD attacker must have been answered: else it did not attack.
	type attack struct {
		name, spec string
		answered   bool
	}
	var attacks []attack
	for _, a := range nbdattack.Attacks {
		attacks = append(attacks, attack{"vm1 " + a.Name, fmt.Sprintf("nbd|%s|vm1/d0|%d|%t", sock, a.Conns, a.Invalid), true})
	}
	attacks = append(attacks, attack{"600 idle TCP connections on the TLS listener", "flood|" + floodAddr + "|600", false})
	shares := make([][]float64, len(attacks))
	prev, _ := fio()
	for r := 0; r < rounds; r++ {
		for i, a := range attacks {
			stop := startAttacker(t, gw.Namespace, a.spec)
			cpu0 := cpuTicks(t, gw.PID)
			start := time.Now()
			v, least := fio()
			el := time.Since(start)
			cpu1 := cpuTicks(t, gw.PID)
			n := stop()
			next, _ := fio()
			alone := (prev + next) / 2
			shares[i] = append(shares[i], v/alone)
			t.Logf("round %d, %s: vm2 %.0f IOPS (its least second %.0f), alone %.0f and %.0f: %.0f%%; the attacker got %.0f replies/s; the gateway used %.0f%% of a CPU; load %s",
				r+1, a.name, v, least, prev, next, 100*v/alone, float64(n)/el.Seconds(), float64(cpu1-cpu0)/el.Seconds(), loadavg())
			if a.answered && n == 0 {
				t.Errorf("round %d, %s: the attacker got no reply: it did not attack", r+1, a.name)
			}
			if least < guestReservation {
				t.Errorf("round %d, %s: a second of vm2's fio did %.0f IOPS, below its reservation of %d", r+1, a.name, least, guestReservation)
			}
			prev = next
		}
	}
	for i, a := range attacks {
		med := median(shares[i])
		t.Logf("%s: vm2 kept a median %.0f%% of its IOPS alone (rounds %v)", a.name, 100*med, pct(shares[i]))
		if med < minGuestShare {
			t.Errorf("%s: vm2 kept a median %.0f%% of its IOPS alone; want ≥ %.0f%%", a.name, 100*med, 100*minGuestShare)
		}
	}
}

// attackerEnv makes the test binary the attacker of TestGuestHostileVM:
// nbd|SOCKET|EXPORT|CONNS|INVALID (nbdattack.Run) or flood|ADDR|N
// (nbdattack.Flood).
const attackerEnv = "SLUICE_NBD_ATTACKER"

// floodAddr is where the gateway listens for TLS clients, in its host's
// namespace.
const floodAddr = "127.0.0.1:10810"

// startAttacker runs the attack spec in a child process (this test binary)
// in network namespace ns, with one CPU (GOMAXPROCS=1, CPU 1) at
// SCHED_IDLE: it runs when the gateway, pinned to the same CPU, does not,
// as an attacker VM on a core of its own would not take the gateway's. It
// returns once the attack is under way; stop ends it and returns the
// replies the attacker got.
func startAttacker(t *testing.T, ns, spec string) (stop func() int64) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "chrt", "--idle", "0", "taskset", "-c", "1", os.Args[0], "-test.run=^TestGuestHostileVM$")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", attackerEnv+"="+spec)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waited error
	var once sync.Once
	wait := func() { once.Do(func() { stdin.Close(); waited = cmd.Wait() }) }
	t.Cleanup(func() { // the test failed while it ran
		cmd.Process.Kill()
		wait()
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "attacking" {
		wait()
		t.Fatalf("attacker %s: %v: %s", spec, waited, errb.String())
	}
	return func() int64 {
		stdin.Close() // the attacker stops, then prints its replies
		var n int64
		if lines.Scan() {
			fmt.Sscanf(lines.Text(), "replies %d", &n)
		}
		wait()
		if waited != nil {
			t.Fatalf("attacker %s: %v: %s", spec, waited, errb.String())
		}
		return n
	}
}

// runAttacker is the attacker process: it starts the attack spec says,
// prints "attacking", and when its stdin closes ends it, prints
// "replies N" and exits.
func runAttacker(spec string) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", attackerEnv, spec, err)
		os.Exit(1)
	}
	f := strings.Split(spec, "|")
	var replies *atomic.Int64
	var stop func()
	switch {
	case len(f) == 5 && f[0] == "nbd":
		conns, _ := strconv.Atoi(f[3])
		ctx, cancel := context.WithCancel(context.Background())
		r, wait, err := nbdattack.Run(ctx, f[1], f[2], 64<<20, nbdattack.Attack{Conns: conns, Invalid: f[4] == "true"})
		if err != nil {
			fail(err)
		}
		replies, stop = r, func() { cancel(); wait() }
	case len(f) == 3 && f[0] == "flood":
		n, _ := strconv.Atoi(f[2])
		var sources []string
		for i := 1; i <= 6; i++ {
			sources = append(sources, fmt.Sprintf("127.0.0.%d", i))
		}
		s, err := nbdattack.Flood(f[1], n, sources, time.Second)
		if err != nil {
			fail(err)
		}
		replies, stop = &atomic.Int64{}, s
	default:
		fail(fmt.Errorf("want nbd|SOCKET|EXPORT|CONNS|INVALID or flood|ADDR|N"))
	}
	fmt.Println("attacking")
	_, _ = io.Copy(io.Discard, os.Stdin)
	stop()
	fmt.Printf("replies %d\n", replies.Load())
	os.Exit(0)
}

// cpuTicks is the user and system time of process pid in USER_HZ ticks
// (1/100 s), from /proc/PID/stat.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("CPU time of %d: %v", pid, err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// pin sets the CPU affinity of every thread of pid to cpus (taskset -a).
func pin(t *testing.T, pid int, cpus string) {
	t.Helper()
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("taskset -a -p -c %s %d: %v: %s", cpus, pid, err, out)
	}
}

// pct formats fractions as percentages.
func pct(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f%%", 100*x)
	}
	return strings.Join(s, " ")
}
