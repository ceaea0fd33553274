package storage

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testcert"
	"sluice/storage/nbd"
)

// newTestGateway is a gateway for oneHostPolicy (VMs a, b, c, d on h1)
// in front of an in-process memory datastore; it serves nothing yet.
func newTestGateway(t *testing.T) *Gateway {
	t.Helper()
	p := parsePolicy(t, oneHostPolicy)
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "nbd://" + newMemVolumes(p).serve(t, nil)}, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// serveVMSockets opens and serves the per-VM sockets of g in dir.
func serveVMSockets(t *testing.T, g *Gateway, dir string, perm SocketPerm) {
	t.Helper()
	ls, err := ListenVMs(dir, g.VMs(), perm)
	if err != nil {
		t.Fatal(err)
	}
	for vm, l := range ls {
		go g.ServeVM(l, vm)
	}
}

func roundTrip(t *testing.T, c *nbd.Client, off uint64) {
	t.Helper()
	want := bytes.Repeat([]byte{byte(off)}, 4096)
	if err := c.WriteAt(want, off, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := c.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, want))
	}
}

// Each VM has its own socket, mode 0600; a client on VM a's socket lists
// and opens a's disk only; the sockets go when the gateway stops.
func TestGatewayVMSockets(t *testing.T) {
	g := newTestGateway(t)
	if vms := g.VMs(); !reflect.DeepEqual(vms, []string{"a", "b", "c", "d"}) {
		t.Fatalf("VMs() = %q", vms)
	}
	dir := filepath.Join(t.TempDir(), "gw-st1-h1")
	serveVMSockets(t, g, dir, DefaultSocketPerm)
	for _, vm := range g.VMs() {
		fi, err := os.Lstat(VMSocket(dir, vm))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a socket with 0600", VMSocket(dir, vm), fi.Mode())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "unix", VMSocket(dir, "a"), "a/d0")
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, 8192)
	c.Close()
	for _, other := range []string{"b/d0", "c/d0", "x/d0"} {
		if c, err := nbd.Dial(ctx, "unix", VMSocket(dir, "a"), other); err == nil {
			c.Close()
			t.Errorf("a's socket opened %s", other)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("no export named %q", other)) {
			t.Errorf("a's socket, %s: %v; want the unknown-export answer", other, err)
		}
	}
	if st := g.Status(); st.Listen != "unix:"+filepath.Join(dir, "*.sock") {
		t.Errorf("status listen = %q", st.Listen)
	}
	g.Close()
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		left, _ := filepath.Glob(filepath.Join(dir, "*"))
		t.Errorf("socket directory left after Close (%v): %q", err, left)
	}
}

// nbdinfo (libnbd), a real NBD client, lists on VM b's socket only b's
// disk; as another user it cannot connect to a root-only socket, and can
// once the socket is given to it (--socket-owner).
func TestLiveVMSocketRealClient(t *testing.T) {
	needTools(t, "nbdinfo")
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it runs nbdinfo as user nobody)")
	}
	g := newTestGateway(t)
	base, err := os.MkdirTemp("", "sl-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // MkdirTemp's 0700 would stop nobody anyway
		t.Fatal(err)
	}
	root, shared := filepath.Join(base, "root"), filepath.Join(base, "shared")
	serveVMSockets(t, g, root, DefaultSocketPerm)
	serveVMSockets(t, g, shared, SocketPerm{UID: 65534, GID: -1, Mode: 0o600})
	uri := func(dir, vm, disk string) string {
		return fmt.Sprintf("nbd+unix:///%s/%s?socket=%s", vm, disk, VMSocket(dir, vm))
	}
	nbdinfo := func(asNobody bool, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "nbdinfo", args...)
		if asNobody {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := nbdinfo(false, "--list", "--json", uri(root, "b", "d0"))
	if err != nil {
		t.Fatalf("nbdinfo --list: %v: %s", err, out)
	}
	if !strings.Contains(out, `"export-name": "b/d0"`) || strings.Count(out, `"export-name"`) != 1 {
		t.Fatalf("nbdinfo --list on b's socket, want b/d0 only:\n%s", out)
	}
	if out, err := nbdinfo(false, "--size", uri(root, "b", "d0")); err != nil || strings.TrimSpace(out) != fmt.Sprint(64<<20) {
		t.Fatalf("nbdinfo --size b/d0: %v: %s", err, out)
	}
	if out, err := nbdinfo(false, "--size", "nbd+unix:///a/d0?socket="+VMSocket(root, "b")); err == nil {
		t.Fatalf("nbdinfo opened a/d0 on b's socket: %s", out)
	}
	if out, err := nbdinfo(true, "--size", uri(root, "b", "d0")); err == nil || !strings.Contains(out, "ermission denied") {
		t.Fatalf("nobody on a root 0600 socket: %v: %s; want permission denied", err, out)
	}
	if out, err := nbdinfo(true, "--size", uri(shared, "b", "d0")); err != nil {
		t.Fatalf("nobody on a socket owned by nobody: %v: %s", err, out)
	}
}

// writeTLSDirs makes a CA, the gateway's certificate (server-cert.pem,
// server-key.pem, ca-cert.pem in dir/server) and client directories
// dir/client-ID in the layout libnbd and QEMU read.
func writeTLSDirs(t *testing.T, dir string, ids ...string) *testcert.CA {
	t.Helper()
	ca, err := testcert.NewCA("sluice test CA")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(filepath.Join(dir, "server"), "server", sp); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		cp, err := ca.Client(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := ca.WriteDir(filepath.Join(dir, "client-"+id), "client", cp); err != nil {
			t.Fatal(err)
		}
	}
	return ca
}

func serveTestTLS(t *testing.T, g *Gateway, dir string) string {
	t.Helper()
	sd := filepath.Join(dir, "server")
	cfg, err := ServerTLSConfig(filepath.Join(sd, "server-cert.pem"), filepath.Join(sd, "server-key.pem"), filepath.Join(sd, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.ServeTLS(l, cfg)
	return l.Addr().String()
}

// Over TCP the gateway requires TLS: a client certificate with CN "a"
// opens a's disk only; a plain client is refused with TLS required.
func TestGatewayTLS(t *testing.T) {
	g := newTestGateway(t)
	dir := t.TempDir()
	ca := writeTLSDirs(t, dir, "a")
	addr := serveTestTLS(t, g, dir)
	cp, err := ca.Client("a")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cp.TLS()}, RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.DialTLS(ctx, "tcp", addr, "a/d0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, 4096)
	c.Close()
	if c, err := nbd.DialTLS(ctx, "tcp", addr, "b/d0", cfg); err == nil {
		c.Close()
		t.Fatal("certificate a opened b/d0")
	}
	if c, err := nbd.Dial(ctx, "tcp", addr, "a/d0"); err == nil {
		c.Close()
		t.Fatal("plain TCP client served")
	} else if !strings.Contains(err.Error(), "TLS is required") {
		t.Fatalf("plain TCP client: %v; want TLS required", err)
	}
}

// libnbd's clients, real NBD clients with GnuTLS: nbdinfo with a's
// certificate lists a's disk only and nbdcopy writes through TLS what reads
// back; without TLS nbdinfo is refused.
func TestLiveTLSRealClient(t *testing.T) {
	needTools(t, "nbdinfo", "nbdcopy")
	g := newTestGateway(t)
	dir := t.TempDir()
	writeTLSDirs(t, dir, "a")
	addr := serveTestTLS(t, g, dir)
	certs := filepath.Join(dir, "client-a")
	run := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		return string(out), err
	}
	tlsURI := func(export string) string {
		return fmt.Sprintf("nbds://%s/%s?tls-certificates=%s", addr, export, certs)
	}
	out, err := run("nbdinfo", "--list", "--json", tlsURI(""))
	if err != nil {
		t.Fatalf("nbdinfo --list over TLS: %v: %s", err, out)
	}
	if !strings.Contains(out, `"export-name": "a/d0"`) || strings.Count(out, `"export-name"`) != 1 {
		t.Fatalf("nbdinfo --list with a's certificate, want a/d0 only:\n%s", out)
	}
	if out, err := run("nbdinfo", "--size", tlsURI("b/d0")); err == nil {
		t.Fatalf("nbdinfo with a's certificate opened b/d0: %s", out)
	}
	out, err = run("nbdinfo", "--size", fmt.Sprintf("nbd://%s/a/d0", addr))
	if err == nil || !strings.Contains(strings.ToLower(out), "tls") {
		t.Fatalf("plain nbdinfo: %v: %s; want a refusal naming TLS", err, out)
	}
	t.Logf("plain nbdinfo refused: %s", strings.TrimSpace(out))
	src := filepath.Join(dir, "src")
	want := bytes.Repeat([]byte("sluice TLS 0123456789abcdef\n"), 1<<16) // 1.75 MiB
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run("nbdcopy", src, tlsURI("a/d0")); err != nil {
		t.Fatalf("nbdcopy to a/d0 over TLS: %v: %s", err, out)
	}
	back := filepath.Join(dir, "back")
	if out, err := run("nbdcopy", tlsURI("a/d0"), back); err != nil {
		t.Fatalf("nbdcopy from a/d0 over TLS: %v: %s", err, out)
	}
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 64<<20 || !bytes.Equal(got[:len(want)], want) {
		t.Fatalf("read back %d bytes, first %d equal: %v", len(got), len(want), bytes.Equal(got[:min(len(got), len(want))], want))
	}
}

// QEMU's own NBD client (qemu-storage-daemon, the block layer QEMU guests
// use) attaches a disk over TLS with the VM's certificate (tls-creds-x509)
// and through the VM's socket; data written through it by nbdcopy (via the
// daemon's own NBD export) reads back through the gateway. Without TLS
// credentials QEMU is refused.
func TestLiveQEMUClient(t *testing.T) {
	needTools(t, "qemu-storage-daemon", "nbdcopy")
	g := newTestGateway(t)
	dir := t.TempDir()
	writeTLSDirs(t, dir, "c")
	addr := serveTestTLS(t, g, dir)
	host, port, _ := net.SplitHostPort(addr)
	socks := filepath.Join(dir, "vms")
	serveVMSockets(t, g, socks, DefaultSocketPerm)
	qsd := func(name, server string, tlsCreds bool) (string, *exec.Cmd, string) {
		t.Helper()
		out := filepath.Join(dir, name+".sock")
		args := []string{}
		bd := `{"driver":"nbd","node-name":"gw","server":` + server + `,"export":"c/d0"`
		if tlsCreds {
			args = append(args, "--object", "tls-creds-x509,id=tls0,dir="+filepath.Join(dir, "client-c")+",endpoint=client")
			bd += `,"tls-creds":"tls0"`
		}
		args = append(args, "--blockdev", bd+"}", "--nbd-server", "addr.type=unix,addr.path="+out,
			"--export", "type=nbd,id=e0,node-name=gw,name=x,writable=on")
		cmd := exec.Command("qemu-storage-daemon", args...)
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill(); <-exited })
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case err := <-exited:
				exited <- err
				return "", nil, fmt.Sprintf("exited (%v): %s", err, log.String())
			default:
			}
			if c, err := net.Dial("unix", out); err == nil {
				c.Close()
				return out, cmd, ""
			}
			if time.Now().After(deadline) {
				t.Fatalf("qemu-storage-daemon %s: no export after 20 s: %s", name, log.String())
			}
			time.Sleep(20 * time.Millisecond) // polling an external process, with a deadline
		}
	}
	want := bytes.Repeat([]byte("QEMU through sluice\n"), 1<<15)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ name, server string }{
		{"tls", `{"type":"inet","host":"` + host + `","port":"` + port + `"}`},
		{"unix", `{"type":"unix","path":"` + VMSocket(socks, "c") + `"}`},
	} {
		out, _, failed := qsd(c.name, c.server, c.name == "tls")
		if failed != "" {
			t.Fatalf("qemu-storage-daemon over %s: %s", c.name, failed)
		}
		off := uint64(i) << 20
		// nbdcopy writes at offset 0 of the export: put the data at off by
		// writing a file of off zero bytes followed by the data.
		img := filepath.Join(dir, c.name+".img")
		if err := os.WriteFile(img, append(make([]byte, off), want...), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		o, err := exec.CommandContext(ctx, "nbdcopy", "--flush", img, "nbd+unix:///x?socket="+out).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("nbdcopy into QEMU's %s attachment: %v: %s", c.name, err, o)
		}
		cl, err := nbd.Dial(context.Background(), "unix", VMSocket(socks, "c"), "c/d0")
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		err = cl.ReadAt(got, off)
		cl.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("data QEMU wrote over %s: read back through the gateway: %v, equal %v", c.name, err, bytes.Equal(got, want))
		}
	}
	// Plain QEMU on the TLS-only TCP listener: refused.
	_, _, failed := qsd("plain", `{"type":"inet","host":"`+host+`","port":"`+port+`"}`, false)
	if failed == "" || !strings.Contains(failed, "TLS") {
		t.Fatalf("QEMU without TLS on the TLS listener: %q; want a refusal naming TLS", failed)
	}
	t.Logf("QEMU without TLS: %s", strings.TrimSpace(failed))
}
