package nbd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// memServerEnv makes the test binary a server for TestIdleConnectionsMemory:
// it serves on the Unix socket the variable names and answers every line
// on stdin with its memStats.
const memServerEnv = "SLUICE_NBD_MEMSERVER"

type memStats struct {
	Conns     int    // open connections
	GoBytes   uint64 // heap in use + goroutine stacks, after a GC
	RSSBytes  uint64 // resident set size (/proc/self/status VmRSS)
	Refused   uint64
	HeapBytes uint64
	StackByte uint64
}

func readMemStats(s *Server) memStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	st := memStats{Conns: int(s.nconns.Load()), GoBytes: m.HeapInuse + m.StackInuse, Refused: s.Refused(),
		HeapBytes: m.HeapInuse, StackByte: m.StackInuse}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				st.RSSBytes = kb << 10
			}
		}
	}
	return st
}

func runMemServer(sock string) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	s := &Server{Exports: MapExports{"d": &memBackend{data: make([]byte, 1<<20)}}}
	go s.Serve(l)
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		_ = out.Encode(readMemStats(s))
	}
	os.Exit(0)
}

// 1,000 connections that opened an export, wrote and read 4 KiB each and
// sit idle grow the server (a separate process) by less than
// 1,000 × IdleConnBytes, in Go memory and in RSS.
func TestIdleConnectionsMemory(t *testing.T) {
	if sock := os.Getenv(memServerEnv); sock != "" {
		runMemServer(sock)
	}
	if raceEnabled {
		t.Skip("memory is not measurable under the race detector (its shadow memory grows RSS several times)")
	}
	const n = 1000
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleConnectionsMemory$")
	cmd.Env = append(os.Environ(), memServerEnv+"="+sock, "GOMAXPROCS=1")
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
	stats := func() memStats {
		t.Helper()
		if _, err := fmt.Fprintln(stdin); err != nil {
			t.Fatal(err)
		}
		var st memStats
		if err := dec.Decode(&st); err != nil {
			t.Fatalf("server stats: %v", err)
		}
		return st
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not listen within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for stats().Conns != 0 { // the probe above has ended
		if time.Now().After(deadline) {
			t.Fatal("probe connection still open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	base := stats()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := make([]*Client, 0, n)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		c, err := Dial(ctx, "unix", sock, "d")
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		clients = append(clients, c)
		if err := c.WriteAt(buf, uint64(i%256)*4096, false); err != nil {
			t.Fatal(err)
		}
		if err := c.ReadAt(buf, uint64(i%256)*4096); err != nil {
			t.Fatal(err)
		}
	}
	st := stats()
	if st.Conns != n {
		t.Fatalf("server has %d connections open, want %d", st.Conns, n)
	}
	goGrowth := int64(st.GoBytes) - int64(base.GoBytes)
	rssGrowth := int64(st.RSSBytes) - int64(base.RSSBytes)
	t.Logf("%d idle connections: Go heap+stacks %.1f → %.1f MiB (+%.0f KiB per connection; heap %.1f MiB, stacks %.1f MiB), RSS %.1f → %.1f MiB (+%.0f KiB per connection); cap %d KiB per connection",
		n, mib(base.GoBytes), mib(st.GoBytes), float64(goGrowth)/n/1024, mib(st.HeapBytes), mib(st.StackByte),
		mib(base.RSSBytes), mib(st.RSSBytes), float64(rssGrowth)/n/1024, IdleConnBytes>>10)
	if goGrowth > n*IdleConnBytes {
		t.Errorf("Go memory grew by %d bytes for %d connections, over the stated %d per connection", goGrowth, n, IdleConnBytes)
	}
	if rssGrowth > n*IdleConnBytes {
		t.Errorf("RSS grew by %d bytes for %d connections, over the stated %d per connection", rssGrowth, n, IdleConnBytes)
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
