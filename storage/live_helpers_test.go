package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/policy"
	"sluice/storage/nbd"
)

// Live tests run real nbdkit and fio processes (Debian packages nbdkit and
// fio, installed by scripts/deps.sh). They are skipped with -short and fail
// with a clear message when a tool is missing.

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("live storage test: skipped with -short")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("live storage test needs %s in PATH (install it: scripts/deps.sh): %v", tool, err)
		}
	}
}

// prepareDatastore makes a directory holding datastore ds1 of p (its
// volumes and the stats volume).
func prepareDatastore(t *testing.T, p *policy.Policy) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := CreateVolumes(dir, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startNbdkit runs nbdkit emulating the array on a unix socket and returns
// the datastore URI.
func startNbdkit(t *testing.T, array Array) string {
	uri, _ := startNbdkitCmd(t, array, "")
	return uri
}

// startNbdkitCmd is startNbdkit on socket sock ("": a new one) that also
// returns the process, for tests that kill it.
func startNbdkitCmd(t *testing.T, array Array, sock string, filters ...string) (string, *exec.Cmd) {
	t.Helper()
	if sock == "" {
		sock = filepath.Join(t.TempDir(), "ds.sock")
	}
	os.Remove(sock) // left by a killed nbdkit
	args := append([]string{"-f", "-U", sock}, filters...)
	args = append(args, array.NbdkitArgs()...)
	cmd := exec.Command("nbdkit", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("nbdkit: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	uri := "nbd+unix:///?socket=" + sock
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := nbd.Dial(ctx, "unix", sock, StatsVolume)
		cancel()
		if err == nil {
			c.Close()
			return uri, cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdkit did not come up: %v: %s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling an external process, with deadline
	}
}

func parsePolicy(t *testing.T, yaml string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

// runningGateway is a gateway serving on 127.0.0.1 with its period series.
type runningGateway struct {
	g    *Gateway
	addr string
	mu   sync.Mutex
	hist []Status
}

func (r *runningGateway) series() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Status(nil), r.hist...)
}

func startGateway(t *testing.T, p *policy.Policy, host string, dss map[string]string, period time.Duration, addr string) *runningGateway {
	t.Helper()
	r := &runningGateway{}
	g, err := New(Options{Host: host, Policy: p, Datastores: dss, Period: period,
		OnPeriod: func(s Status) { r.mu.Lock(); r.hist = append(r.hist, s); r.mu.Unlock() },
		Logf:     t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port of a just-closed gateway
	}
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	r.g, r.addr = g, l.Addr().String()
	go g.Serve(l)
	t.Cleanup(func() { g.Close() })
	return r
}

// fioJob is one fio job against one export.
type fioJob struct {
	name, uri string
	rw        string // randread, randwrite, randrw
	bs        string
	iodepth   int
	extra     []string // more job options, "key=value"
}

// fioResult is one job's outcome from fio's JSON output.
type fioResult struct {
	IOPS float64
	// Series is the job's IOPS per log interval (only when runFio was
	// given logMs > 0), after any ramp time.
	Series    []float64
	LatMeanUs float64
	LatP50Us  float64
	Errors    int
}

// expectNoFioErrors reports every fio job that counted an I/O or verify
// error.
func expectNoFioErrors(t *testing.T, res map[string]fioResult) {
	t.Helper()
	for name, r := range res {
		if r.Errors != 0 {
			t.Errorf("fio job %s: %d I/O or verify errors", name, r.Errors)
		}
	}
}

// runFio runs the jobs in one fio process and returns the per-job results.
func runFio(ctx context.Context, t *testing.T, global []string, jobs []fioJob) (map[string]fioResult, error) {
	return runFioLog(ctx, t, global, jobs, 0)
}

// runFioLog is runFio that also records each job's IOPS every logMs.
func runFioLog(ctx context.Context, t *testing.T, global []string, jobs []fioJob, logMs int) (map[string]fioResult, error) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("[global]\nioengine=nbd\nthread\ngroup_reporting=0\n")
	if logMs > 0 {
		fmt.Fprintf(&b, "log_avg_msec=%d\n", logMs)
	}
	for _, g := range global {
		b.WriteString(g + "\n")
	}
	for _, j := range jobs {
		fmt.Fprintf(&b, "[%s]\nuri=%s\nrw=%s\nbs=%s\niodepth=%d\n", j.name, j.uri, j.rw, j.bs, j.iodepth)
		if logMs > 0 {
			fmt.Fprintf(&b, "write_iops_log=%s\n", filepath.Join(dir, j.name))
		}
		for _, e := range j.extra {
			b.WriteString(e + "\n")
		}
	}
	jf := filepath.Join(dir, "job.fio")
	if err := os.WriteFile(jf, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "fio", "--output-format=json", jf)
	cmd.Dir = dir // fio writes its verify state files into the working directory
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	var rep struct {
		Jobs []struct {
			Name  string `json:"jobname"`
			Error int    `json:"error"`
			Read  fioDir `json:"read"`
			Write fioDir `json:"write"`
		} `json:"jobs"`
	}
	js := out.Bytes()
	if i := bytes.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal(js, &rep); err != nil {
		return nil, fmt.Errorf("fio: %v (run error %v): %s %s", err, runErr, errb.String(), out.String())
	}
	res := map[string]fioResult{}
	for _, j := range rep.Jobs {
		r := fioResult{IOPS: j.Read.IOPS + j.Write.IOPS, Errors: j.Error}
		n := j.Read.Lat.N + j.Write.Lat.N
		if n > 0 {
			r.LatMeanUs = (j.Read.Lat.Mean*float64(j.Read.Lat.N) + j.Write.Lat.Mean*float64(j.Write.Lat.N)) / float64(n) / 1000
		}
		r.LatP50Us = max(j.Read.Lat.Pct["50.000000"], j.Write.Lat.Pct["50.000000"]) / 1000
		if logMs > 0 {
			// fio numbers the log by the job's index: NAME_iops.N.log.
			if m, _ := filepath.Glob(filepath.Join(dir, j.Name+"_iops.*.log")); len(m) == 1 {
				r.Series = readIOPSLog(m[0])
			}
		}
		res[j.Name] = r
	}
	if runErr != nil {
		return res, fmt.Errorf("fio: %v: %s", runErr, lastLines(errb.String(), 5))
	}
	return res, nil
}

type fioDir struct {
	IOPS float64 `json:"iops"`
	Lat  struct {
		N    int64              `json:"N"`
		Mean float64            `json:"mean"`
		Pct  map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

func within(got, want, tol float64) bool { return got >= want*(1-tol) && got <= want*(1+tol) }

func parsePolicyB(yaml string) (*policy.Policy, error) {
	return policy.Parse("bench.yaml", []byte(yaml))
}

// readIOPSLog reads a fio IOPS log ("msec, iops, dir, bs, prio" lines).
func readIOPSLog(path string) []float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []float64
	for _, line := range strings.Split(string(b), "\n") {
		var ms, iops float64
		if _, err := fmt.Sscanf(line, "%g, %g,", &ms, &iops); err == nil {
			out = append(out, iops)
		}
	}
	return out
}

// median of v (NaN when empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
