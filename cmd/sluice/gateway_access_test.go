package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testcert"
	"sluice/policy"
	"sluice/storage"
	"sluice/storage/nbd"
)

// TestGatewayListenUsage: TCP without TLS, TLS without TCP, a bad socket
// mode or owner and caps below 1 are one line and exit 2, before the policy
// is read or anything listens.
func TestGatewayListenUsage(t *testing.T) {
	base := []string{"gateway", "--host", "h1", "--policy", "/nonexistent.yaml"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "127.0.0.1:10809"}, "sluice gateway: --listen 127.0.0.1:10809: TCP is served only with TLS: give --tls-cert, --tls-key and --tls-ca"},
		{[]string{"--listen", ":10809", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, "TCP is served only with TLS"},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"}, "need a --listen ADDR:PORT"},
		{[]string{"--socket-mode", "rw"}, `--socket-mode "rw": want an octal mode`},
		{[]string{"--socket-mode", "01777"}, `--socket-mode "01777": want an octal mode`},
		{[]string{"--socket-owner", "no-such-user-sluice"}, `--socket-owner "no-such-user-sluice": no user`},
		{[]string{"--socket-owner", "root:no-such-group-sluice"}, `no group "no-such-group-sluice"`},
		{[]string{"--max-conns", "0"}, "--max-conns and --max-conns-per-vm must be ≥ 1"},
	} {
		var stdout, stderr bytes.Buffer
		args := append(append([]string{}, base...), c.args...)
		code := run(args, &stdout, &stderr)
		if code != exitUsage || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("sluice %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stderr.String(), c.want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

const gatewayAccessPolicy = `cluster: sgwcli
hosts:
  - {name: h1, cpu: {cores: 2, mhz: 2000}, memory: 4GiB, uplinks: [{name: u0, speed: 10Gbps}]}
datastores:
  - {name: ds1}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 16MiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 16MiB}]}
`

// `sluice gateway` end to end, in the process: with --socket-dir,
// --listen unix:PATH and a TLS listener it serves vm1's disk on vm1's
// socket only, every disk on the administrator's socket, and over TLS the
// disk of the certificate's VM; SIGTERM stops it (exit 0) and its sockets
// go.
func TestGatewayCommandServes(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pf, []byte(gatewayAccessPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(pf)
	if err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "ds1")
	if err := os.Mkdir(vols, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.CreateVolumes(vols, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	ca, err := testcert.NewCA("cli test CA")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(filepath.Join(dir, "tls"), "server", sp); err != nil {
		t.Fatal(err)
	}
	socks, admin := filepath.Join(dir, "socks"), filepath.Join(dir, "admin.sock")
	tlsDir := filepath.Join(dir, "tls")
	var stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"gateway", "--host", "h1", "--policy", pf, "--datastore", "ds1=dir:" + vols,
			"--socket-dir", socks, "--listen", "unix:" + admin, "--listen", "127.0.0.1:0",
			"--tls-cert", filepath.Join(tlsDir, "server-cert.pem"), "--tls-key", filepath.Join(tlsDir, "server-key.pem"),
			"--tls-ca", filepath.Join(tlsDir, "ca-cert.pem"), "--status-file", filepath.Join(dir, "status.json")}, io.Discard, &stderr)
	}()
	var tlsAddr string
	deadline := time.Now().Add(20 * time.Second)
	for tlsAddr == "" {
		for _, line := range strings.Split(stderr.String(), "\n") {
			if i := strings.Index(line, " (TLS)"); i > 0 && strings.Contains(line, "serving") {
				f := strings.Fields(line[:i])
				tlsAddr = strings.TrimSuffix(f[len(f)-1], ",")
			}
		}
		select {
		case c := <-code:
			t.Fatalf("gateway exited %d: %s", c, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not serving after 20 s: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the command's output, with a deadline
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(network, addr, export string, cfg *tls.Config) error {
		var c *nbd.Client
		var err error
		if cfg != nil {
			c, err = nbd.DialTLS(ctx, network, addr, export, cfg)
		} else {
			c, err = nbd.Dial(ctx, network, addr, export)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		return c.WriteAt([]byte("sluice"), 0, true)
	}
	cp, err := ca.Client("vm2")
	if err != nil {
		t.Fatal(err)
	}
	vm2TLS := &tls.Config{Certificates: []tls.Certificate{cp.TLS()}, RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	for _, c := range []struct {
		network, addr, export string
		cfg                   *tls.Config
		ok                    bool
	}{
		{"unix", storage.VMSocket(socks, "vm1"), "vm1/d0", nil, true},
		{"unix", storage.VMSocket(socks, "vm1"), "vm2/d0", nil, false},
		{"unix", admin, "vm1/d0", nil, true},
		{"unix", admin, "vm2/d0", nil, true},
		{"tcp", tlsAddr, "vm2/d0", vm2TLS, true},
		{"tcp", tlsAddr, "vm1/d0", vm2TLS, false},
		{"tcp", tlsAddr, "vm2/d0", nil, false},
	} {
		if err := open(c.network, c.addr, c.export, c.cfg); (err == nil) != c.ok {
			t.Errorf("%s %s, export %s, TLS %v: %v; want success %v", c.network, c.addr, c.export, c.cfg != nil, err, c.ok)
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != exitOK {
			t.Fatalf("gateway exited %d after SIGTERM: %s", c, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("gateway still running 20 s after SIGTERM")
	}
	for _, f := range []string{socks, admin, filepath.Join(dir, "status.json")} {
		if _, err := os.Lstat(f); !os.IsNotExist(err) {
			t.Errorf("%s left after the gateway stopped (%v)", f, err)
		}
	}
}
