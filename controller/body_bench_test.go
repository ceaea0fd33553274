package controller

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// realController is a `sluice controller` process on a temporary data
// directory, with its embedded etcd on 127.0.0.1.
type realController struct {
	pid         int
	server, dir string
	stderr      string // file
	token, ca   string
	cmd         *exec.Cmd
}

// sluiceBin is $SLUICE_BIN, or a sluice built into dir.
func sluiceBin(b *testing.B, dir string) string {
	if bin := os.Getenv("SLUICE_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "sluice/cmd/sluice").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startController starts bin's controller in dir/data with args and waits
// until it says it is ready.
func startController(b *testing.B, bin, dir string, args ...string) *realController {
	rc := &realController{dir: filepath.Join(dir, "data"), stderr: filepath.Join(dir, "controller.stderr")}
	port := freePort(b)
	rc.server = fmt.Sprintf("https://127.0.0.1:%d", port)
	rc.cmd = exec.Command(bin, append([]string{"controller", "--data-dir", rc.dir, "--listen", fmt.Sprintf("127.0.0.1:%d", port)}, args...)...)
	stdout, _ := rc.cmd.StdoutPipe()
	se, err := os.Create(rc.stderr)
	if err != nil {
		b.Fatal(err)
	}
	rc.cmd.Stderr = se
	if err := rc.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	rc.pid = rc.cmd.Process.Pid
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case ready <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-ready:
		if !strings.Contains(l, "ready") {
			rc.stop()
			b.Fatalf("controller: %s", l)
		}
	case <-time.After(60 * time.Second):
		rc.stop()
		b.Fatal("controller not ready after 60 s")
	}
	if rc.token, err = ReadToken(filepath.Join(rc.dir, "token")); err != nil {
		rc.stop()
		b.Fatal(err)
	}
	rc.ca = filepath.Join(rc.dir, "tls", "cert.pem")
	return rc
}

// stop kills the controller (its embedded etcd is in the same process).
func (rc *realController) stop() {
	_ = rc.cmd.Process.Kill()
	_ = rc.cmd.Wait()
}

// BenchmarkLargeBodies runs the real `sluice controller` (embedded etcd on
// 127.0.0.1, a temporary data directory) and sends it sixteen concurrent
// POST /v1/policy with 50 MB bodies, each client on its own connection:
// first declared by Content-Length, then chunked (a client that does not
// say the length). It counts the answers and reports the controller's RSS
// at rest and its peak (VmHWM) after each round, in MiB. Run it once:
//
//	go test -run '^$' -bench LargeBodies -benchtime=1x ./controller
//
// (bench/controller-bodies.sh compares two revisions). SLUICE_BIN names a
// sluice binary to measure instead of building one; SLUICE_BODIES and
// SLUICE_BODY_MB change the number and size of the bodies.
func BenchmarkLargeBodies(b *testing.B) {
	n, mb := envInt("SLUICE_BODIES", 16), envInt("SLUICE_BODY_MB", 50)
	tmp := b.TempDir()
	bin := sluiceBin(b, tmp)
	rc := startController(b, bin, tmp, "--drs-interval", "0")
	defer rc.stop()
	time.Sleep(time.Second) // let the embedded etcd settle
	rssIdle := procStatus(rc.pid, "VmRSS")
	var t strings.Builder
	fmt.Fprintf(&t, "controller under %d concurrent POST /v1/policy of %d MB each, %d CPUs, sluice %s\n", n, mb, runtime.NumCPU(), bin)
	fmt.Fprintf(&t, "| bodies | answers | time | RSS at rest | peak RSS (VmHWM) |\n| --- | --- | --- | --- | --- |\n")
	for _, declared := range []bool{true, false} {
		answers := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for range n {
			cl, err := NewClient(rc.server, rc.token, rc.ca)
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := postBig(cl, int64(mb)*1e6, declared)
				mu.Lock()
				answers[a]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		took := time.Since(start)
		hwm := procStatus(rc.pid, "VmHWM")
		what := map[bool]string{true: "Content-Length", false: "chunked"}[declared]
		var as []string
		for a, k := range answers {
			as = append(as, fmt.Sprintf("%d × %s", k, a))
		}
		fmt.Fprintf(&t, "| %s | %s | %v | %.0f MiB | %.0f MiB |\n", what, strings.Join(as, ", "), took.Round(10*time.Millisecond), rssIdle, hwm)
		b.ReportMetric(hwm, "peak-rss-MiB-"+map[bool]string{true: "declared", false: "chunked"}[declared])
	}
	fmt.Print(t.String())
}

// postBig sends one POST /v1/policy of size bytes and returns what came
// back: a status, or the error's kind.
func postBig(cl *Client, size int64, declared bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := &lazyBody{n: size}
	req, err := http.NewRequestWithContext(ctx, "POST", cl.Server+"/v1/policy", io.NopCloser(body))
	if err != nil {
		return err.Error()
	}
	if declared {
		req.ContentLength = size
	}
	req.Header.Set("Authorization", "Bearer "+cl.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.HTTP.Do(req)
	if err != nil {
		switch {
		case strings.Contains(err.Error(), "reset"), strings.Contains(err.Error(), "broken pipe"), strings.Contains(err.Error(), "EOF"):
			return "connection closed before the answer"
		}
		return "error: " + firstLine(err.Error())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e ErrorBody
	if err != nil || json.Unmarshal(b, &e) != nil || e.Error == "" {
		return fmt.Sprintf("%d without its error body", resp.StatusCode)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		return fmt.Sprintf("%d (Retry-After %s)", resp.StatusCode, ra)
	}
	return fmt.Sprint(resp.StatusCode)
}
