package storage

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// gwMemEnv makes the test binary the gateway of
// TestGatewayIdleConnectionsMemory: it serves oneHostPolicy's VM sockets
// in the directory the variable names and answers every line on stdin with
// its gwMem.
const gwMemEnv = "SLUICE_GW_MEMTEST"

type gwMem struct {
	GoBytes  uint64 // heap in use + goroutine stacks, after a GC
	RSSBytes uint64 // VmRSS
	Refused  uint64
}

func runGatewayMemChild(t *testing.T, dir string) {
	g := newTestGateway(t)
	g.opts.MaxConnsPerVM = 250
	g.srv.MaxConns = 1000
	serveVMSockets(t, g, dir, DefaultSocketPerm)
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		st := gwMem{GoBytes: m.HeapInuse + m.StackInuse, Refused: g.srv.Refused()}
		if b, err := os.ReadFile("/proc/self/status"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
					kb, _ := strconv.ParseUint(f[1], 10, 64)
					st.RSSBytes = kb << 10
				}
			}
		}
		_ = out.Encode(st)
	}
	os.Exit(0)
}

// A gateway (a separate process) with --max-conns 1000 and
// --max-conns-per-vm 250 takes 250 connections on each of its 4 VMs'
// sockets, each of which opened its disk and wrote and read 4 KiB; the
// connections idle, the gateway has grown by less than 1,000 ×
// nbd.IdleConnBytes in Go memory and in RSS. A 251st connection on a VM's
// socket is closed at once. (The child's Go memory includes the test's
// in-process memory datastore, 257 MiB allocated, mostly untouched: it is
// in both measurements.)
func TestGatewayIdleConnectionsMemory(t *testing.T) {
	if dir := os.Getenv(gwMemEnv); dir != "" {
		runGatewayMemChild(t, dir)
	}
	if raceEnabled {
		t.Skip("memory is not measurable under the race detector (its shadow memory grows RSS several times)")
	}
	dir := filepath.Join(t.TempDir(), "socks")
	cmd := exec.Command(os.Args[0], "-test.run=^TestGatewayIdleConnectionsMemory$")
	cmd.Env = append(os.Environ(), gwMemEnv+"="+dir, "GOMAXPROCS=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	dec := json.NewDecoder(stdout)
	stats := func() gwMem {
		t.Helper()
		if _, err := fmt.Fprintln(stdin); err != nil {
			t.Fatal(err)
		}
		var st gwMem
		if err := dec.Decode(&st); err != nil {
			t.Fatalf("gateway stats: %v", err)
		}
		return st
	}
	vms := []string{"a", "b", "c", "d"}
	waitVMSockets(t, dir, vms) // the child serves once every socket exists
	base := stats()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var clients []*nbd.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	buf := make([]byte, 4096)
	for _, vm := range vms {
		for i := 0; i < 250; i++ {
			c, err := nbd.Dial(ctx, "unix", VMSocket(dir, vm), vm+"/d0")
			if err != nil {
				t.Fatalf("%s: connection %d: %v", vm, i, err)
			}
			clients = append(clients, c)
			off := uint64(i) * 4096
			if err := c.WriteAt(buf, off, false); err != nil {
				t.Fatal(err)
			}
			if err := c.ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One more on a's socket: closed before the greeting.
	conn, err := net.Dial("unix", VMSocket(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 18)); err != io.EOF {
		t.Fatalf("connection 251 on a's socket: read %d bytes, %v; want end of file", n, err)
	}
	conn.Close()
	st := stats()
	if st.Refused != 1 {
		t.Errorf("gateway refused %d connections, want 1", st.Refused)
	}
	n := int64(len(clients))
	goGrowth := int64(st.GoBytes) - int64(base.GoBytes)
	rssGrowth := int64(st.RSSBytes) - int64(base.RSSBytes)
	t.Logf("gateway with %d idle connections: Go heap+stacks %.1f → %.1f MiB (+%.0f KiB per connection), RSS %.1f → %.1f MiB (+%.0f KiB per connection); stated bound %d KiB per connection",
		n, float64(base.GoBytes)/(1<<20), float64(st.GoBytes)/(1<<20), float64(goGrowth)/float64(n)/1024,
		float64(base.RSSBytes)/(1<<20), float64(st.RSSBytes)/(1<<20), float64(rssGrowth)/float64(n)/1024, nbd.IdleConnBytes>>10)
	if goGrowth > n*nbd.IdleConnBytes || rssGrowth > n*nbd.IdleConnBytes {
		t.Errorf("gateway grew by %d bytes (Go) and %d bytes (RSS) for %d connections; stated bound %d per connection",
			goGrowth, rssGrowth, n, nbd.IdleConnBytes)
	}
}
