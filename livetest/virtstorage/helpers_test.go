// Package virtstorage tests the storage path with real QEMU guests under the
// machine's libvirtd, the way a VM uses it: the lab (`lab: {kind: qemu}`)
// attaches each guest's disks to its host's gateway over NBD on a Unix
// socket, the guest sees them as virtio-blk disks (/dev/vda, …), and fio
// runs inside the guest (lab.GuestExec, through the QEMU guest agent) with
// direct I/O on the block device. The tests need root, libvirtd, nbdkit,
// fio and what scripts/deps.sh installs; a missing piece fails them with
// its reason. Each run uses a fresh cluster name (vs…-) and removes its lab
// when it ends, also when it fails; guests power themselves off after a
// few minutes in any case.
package virtstorage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/policy"
	"sluice/storage"
	"sluice/virt"
)

// sluiceBin is the sluice binary built for this run (TestMain): the lab's
// gateways run it.
var sluiceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-virtstorage-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sluiceBin = filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", sluiceBin, "sluice/cmd/sluice").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// preflight fails the test with the first missing capability.
func preflight(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("virtstorage needs root (network namespaces, libvirtd's socket)")
	}
	if _, err := os.Stat(virt.DefaultSocket); err != nil {
		t.Fatalf("libvirtd is not running (%v): run scripts/deps.sh, which installs and starts it", err)
	}
	for _, tool := range []string{"ip", "ss", "nbdkit", "fio", "iperf3", "sockperf", "qemu-ga"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// guestLab is a lab whose VMs are QEMU guests, brought up for one test.
type guestLab struct {
	t     *testing.T
	p     *policy.Policy
	plan  *lab.Plan
	dir   string // state directory and logs
	file  string // the policy file
	start time.Time
}

// guestTTL is how long a test's guests live at most (they power themselves
// off: a killed test leaves no guest running for long).
var guestTTL = 4 * time.Minute

// upLab brings up the lab of policyYAML (a format string whose %s is the
// cluster name: prefix + 4 random hex digits) and registers its removal.
func upLab(t *testing.T, prefix, policyYAML string) *guestLab {
	t.Helper()
	preflight(t)
	cluster := prefix + randHex(2)
	dir, err := os.MkdirTemp("", "sl-"+cluster+"-")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(policyYAML, cluster)), 0o644); err != nil {
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
	l := &guestLab{t: t, p: p, plan: pl, dir: dir, file: file}
	t.Cleanup(func() {
		if err := lab.Down(p.Cluster, dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := lab.Existing(p.Cluster); len(left) > 0 {
			t.Errorf("lab down left namespaces: %v", left)
		}
		if left, err := lab.ExistingDomains(p.Cluster); err != nil || len(left) > 0 {
			t.Errorf("lab down left domains: %v (%v)", left, err)
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", dir)
		}
	})
	var logb bytes.Buffer
	t0 := time.Now()
	if _, err := lab.Up(p, lab.Options{StateDir: dir, PolicyFile: file, Gateway: sluiceBin, Log: &logb, GuestTTL: guestTTL}); err != nil {
		t.Fatalf("lab up: %v\n%s", err, logb.String())
	}
	t.Logf("lab %s up in %v (guests ready; load %s):\n%s", p.Cluster, time.Since(t0).Round(100*time.Millisecond), loadavg(), strings.TrimSpace(logb.String()))
	l.start = time.Now()
	return l
}

// loadavg is the machine's load average, logged beside measurements: the
// machine is shared.
func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// process returns the lab's recorded process named name ("gateway:h1",
// "nbdkit:ds1").
func (l *guestLab) process(name string) lab.Process {
	l.t.Helper()
	st, err := lab.ReadState(l.dir, l.p.Cluster)
	if err != nil || st == nil {
		l.t.Fatalf("lab state: %v", err)
	}
	found, ok := st.Process(name)
	if !ok {
		l.t.Fatalf("lab state lists no %s: %+v", name, st.Processes)
	}
	return found
}

// restartGateway starts the recorded gateway pr again with the same command
// line in the same namespace, as a supervisor would, and waits until its
// socket accepts (and restarts the datastore *ds if nbdkit's known abort
// took it down: livelab.RestartGateway). The lab's Down kills them with
// the namespaces' processes.
func (l *guestLab) restartGateway(pr lab.Process, socket string, ds *lab.Process) {
	l.t.Helper()
	f, err := os.OpenFile(filepath.Join(l.dir, "gateway-restarted.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		l.t.Fatal(err)
	}
	defer f.Close()
	start := func() <-chan struct{} {
		cmd := exec.Command("ip", append([]string{"netns", "exec", pr.Namespace}, pr.Args...)...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			l.t.Fatalf("restart gateway: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		return done
	}
	err = livelab.RestartGateway(l.t, ds, start, func(exited <-chan struct{}) error {
		return livelab.AcceptsOn("unix", socket, 10*time.Second, exited)
	})
	if err != nil {
		log, _ := os.ReadFile(f.Name())
		l.t.Fatalf("the restarted gateway: %v; its log:\n%s", err, log)
	}
}

// gatewayStatus reads host's gateway status file (written every period).
func (l *guestLab) gatewayStatus(host string) (storage.Status, error) {
	return storage.ReadStatusFile(l.statusFile(host))
}

// statusFile is host's gateway status file.
func (l *guestLab) statusFile(host string) string {
	return filepath.Join(lab.DefaultStateDir, "gateway-"+l.p.Cluster+"-"+host+".json")
}

// fioResult is what the tests read from fio's JSON report: the first job,
// and every job by name.
type fioResult struct {
	fioJob
	Exit                 int
	Err                  error
	Stderr               string
	Jobs                 map[string]fioJob
	VerifyErrorsReported bool // fio's stderr reports a verification failure
}

// fioJob is one job of a fio report.
type fioJob struct {
	JobError            int
	ReadIOs, WriteIOs   int64
	ReadIOPS, WriteIOPS float64
	ReadLatMs           float64
	ReadP50Us           float64
	WriteRuntimeMs      int64
	UsrCPU, SysCPU      float64
	ReadKiB, WriteKiB   int64
}

// guestFio runs fio in the guest vm with the given options (without the
// leading "--"), its JSON report on stdout, in the guest's /tmp (the
// guest's root is read-only; fio writes its state files in its working
// directory).
func (l *guestLab) guestFio(ctx context.Context, vm string, opts ...string) fioResult {
	pid, err := l.startFio(ctx, vm, opts...)
	if err != nil {
		return fioResult{Err: err}
	}
	return l.waitFio(ctx, vm, pid)
}

func (l *guestLab) startFio(ctx context.Context, vm string, opts ...string) (int, error) {
	cmd := "cd /tmp && exec fio --output-format=json"
	for _, o := range opts {
		cmd += " '--" + o + "'"
	}
	return lab.GuestStart(ctx, l.p.Cluster, vm, "/bin/sh", "-c", cmd)
}

func (l *guestLab) waitFio(ctx context.Context, vm string, pid int) fioResult {
	res, err := lab.GuestWait(ctx, l.p.Cluster, vm, pid)
	r := fioResult{Exit: res.Exit, Err: err, Stderr: string(res.Stderr), Jobs: map[string]fioJob{}}
	r.VerifyErrorsReported = strings.Contains(r.Stderr, "verify") &&
		(strings.Contains(r.Stderr, "bad") || strings.Contains(r.Stderr, "failed") || strings.Contains(r.Stderr, "mismatch"))
	out := res.Stdout
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	var rep struct {
		Jobs []struct {
			Name  string  `json:"jobname"`
			Error int     `json:"error"`
			Usr   float64 `json:"usr_cpu"`
			Sys   float64 `json:"sys_cpu"`
			Read  ioStats `json:"read"`
			Write ioStats `json:"write"`
		} `json:"jobs"`
	}
	if jerr := json.Unmarshal(out, &rep); jerr != nil || len(rep.Jobs) == 0 {
		if r.Err == nil {
			r.Err = fmt.Errorf("fio report in %s: %v (%d bytes of output)", vm, jerr, len(res.Stdout))
		}
		return r
	}
	for i, j := range rep.Jobs {
		fj := fioJob{JobError: j.Error, UsrCPU: j.Usr, SysCPU: j.Sys,
			ReadIOs: j.Read.TotalIOs, WriteIOs: j.Write.TotalIOs, ReadIOPS: j.Read.IOPS, WriteIOPS: j.Write.IOPS,
			ReadKiB: j.Read.IOKiB, WriteKiB: j.Write.IOKiB, ReadLatMs: j.Read.Clat.Mean / 1e6, WriteRuntimeMs: j.Write.Runtime,
			ReadP50Us: j.Read.Clat.Percentile["50.000000"] / 1e3}
		if i == 0 {
			r.fioJob = fj
		}
		r.Jobs[j.Name] = fj
	}
	return r
}

type ioStats struct {
	IOKiB    int64   `json:"io_kbytes"`
	IOPS     float64 `json:"iops"`
	TotalIOs int64   `json:"total_ios"`
	Runtime  int64   `json:"runtime"` // ms
	Clat     struct {
		Mean       float64            `json:"mean"`       // ns
		Percentile map[string]float64 `json:"percentile"` // ns
	} `json:"clat_ns"`
}

// tail returns the last lines of s, for logs.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
