package livelab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/lab"
	"sluice/policy"
	"sluice/virt"
)

// GuestPreflight fails the test with the first missing capability of a
// lab with QEMU guests (root, libvirtd, the tools the lab and fio need,
// and tools).
func GuestPreflight(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("guests need root (network namespaces, libvirtd's socket)")
	}
	if _, err := os.Stat(virt.DefaultSocket); err != nil {
		t.Fatalf("libvirtd is not running (%v): run scripts/deps.sh, which installs and starts it", err)
	}
	for _, tool := range append([]string{"ip", "ss", "nbdkit", "fio", "iperf3", "sockperf", "qemu-ga"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
}

// RandHex is n random bytes in hex.
func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// GuestLab is a lab whose VMs are QEMU guests, brought up for one test.
type GuestLab struct {
	T     *testing.T
	P     *policy.Policy
	Plan  *lab.Plan
	Dir   string // state directory and logs
	File  string // the policy file
	Start time.Time
}

// UpGuestLab brings up the lab of policyYAML (a format string whose %s is
// the cluster name: prefix + 4 random hex digits) with options o (its
// StateDir, PolicyFile and Log are the lab's own) and registers its
// removal, which also runs when the test fails; the state directory is
// kept then, for its logs.
func UpGuestLab(t *testing.T, prefix, policyYAML string, o lab.Options, tools ...string) *GuestLab {
	t.Helper()
	GuestPreflight(t, tools...)
	cluster := prefix + RandHex(2)
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
	l := &GuestLab{T: t, P: p, Plan: pl, Dir: dir, File: file}
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
	o.StateDir, o.PolicyFile, o.Log = dir, file, &logb
	if _, err := lab.Up(p, o); err != nil {
		t.Fatalf("lab up: %v\n%s", err, logb.String())
	}
	t.Logf("lab %s up in %v (guests ready; load %s):\n%s", p.Cluster, time.Since(t0).Round(100*time.Millisecond), Loadavg(), strings.TrimSpace(logb.String()))
	l.Start = time.Now()
	return l
}

// Loadavg is the machine's load average, logged beside measurements: the
// machine is shared.
func Loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// GuestFioResult is what the tests read from fio's JSON report: the first
// job, and every job by name.
type GuestFioResult struct {
	GuestFioJob
	Exit                 int
	Err                  error
	Stderr               string
	Jobs                 map[string]GuestFioJob
	VerifyErrorsReported bool // fio's stderr reports a verification failure
}

// GuestFioJob is one job of a fio report.
type GuestFioJob struct {
	JobError            int
	ReadIOs, WriteIOs   int64
	ReadIOPS, WriteIOPS float64
	ReadLatMs           float64
	ReadP50Us           float64
	ReadP99Us           float64
	WriteRuntimeMs      int64
	UsrCPU, SysCPU      float64
	ReadKiB, WriteKiB   int64
}

// GuestFio runs fio in the guest vm with the given options (without the
// leading "--"), its JSON report on stdout, in the guest's /tmp (the
// guest's root is read-only; fio writes its state files in its working
// directory).
func (l *GuestLab) GuestFio(ctx context.Context, vm string, opts ...string) GuestFioResult {
	pid, err := l.StartFio(ctx, vm, opts...)
	if err != nil {
		return GuestFioResult{Err: err}
	}
	return l.WaitFio(ctx, vm, pid)
}

// StartFio starts fio in guest vm (as GuestFio) and returns its pid.
func (l *GuestLab) StartFio(ctx context.Context, vm string, opts ...string) (int, error) {
	cmd := "cd /tmp && exec fio --output-format=json"
	for _, o := range opts {
		cmd += " '--" + o + "'"
	}
	return lab.GuestStart(ctx, l.P.Cluster, vm, "/bin/sh", "-c", cmd)
}

// WaitFio waits for the fio StartFio started and reads its report.
func (l *GuestLab) WaitFio(ctx context.Context, vm string, pid int) GuestFioResult {
	res, err := lab.GuestWait(ctx, l.P.Cluster, vm, pid)
	r := GuestFioResult{Exit: res.Exit, Err: err, Stderr: string(res.Stderr), Jobs: map[string]GuestFioJob{}}
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
		fj := GuestFioJob{JobError: j.Error, UsrCPU: j.Usr, SysCPU: j.Sys,
			ReadIOs: j.Read.TotalIOs, WriteIOs: j.Write.TotalIOs, ReadIOPS: j.Read.IOPS, WriteIOPS: j.Write.IOPS,
			ReadKiB: j.Read.IOKiB, WriteKiB: j.Write.IOKiB, ReadLatMs: j.Read.Clat.Mean / 1e6, WriteRuntimeMs: j.Write.Runtime,
			ReadP50Us: j.Read.Clat.Percentile["50.000000"] / 1e3, ReadP99Us: j.Read.Clat.Percentile["99.000000"] / 1e3}
		if i == 0 {
			r.GuestFioJob = fj
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

// Tail returns the last n lines of s, for logs.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// EnvInt is the positive integer in environment variable name, def when
// it is unset; anything else fails the test.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// Median is the median of v (the upper one of an even count); NaN when v
// is empty.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// RunWithSluice is a TestMain body: it builds the sluice binary
// (SluiceBinary) into *bin and runs the tests; the exit code is the
// tests'.
func RunWithSluice(m *testing.M, bin *string) int {
	b, err := SluiceBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*bin = b
	return m.Run()
}
