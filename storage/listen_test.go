package storage

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// A gateway listening on a Unix socket ("unix:PATH") serves its disks there
// as over TCP: data written through it reads back, and its status names the
// socket in the form --listen takes.
func TestGatewayUnixSocket(t *testing.T) {
	p := parsePolicy(t, oneHostPolicy)
	dsAddr := newMemVolumes(p).serve(t, nil)
	g, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "nbd://" + dsAddr}, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "run", "gw-h1.sock") // directory created by Listen
	l, err := Listen("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	if got := listenName(l); got != "unix:"+sock {
		t.Errorf("status listen = %q, want unix:%s", got, sock)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	network, addr, export, err := nbd.ParseURI("nbd+unix:///b/d0?socket=" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, network, addr, export)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("unix"), 1024)
	if err := c.WriteAt(want, 8192, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := c.ReadAt(got, 8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("data read back through the Unix socket differs")
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	g.Close()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket file left behind after Close: %v", err)
	}
}

// Listen replaces a socket file whose server died, refuses one a server
// listens on and a path that is not a socket, each with a one-line error
// naming the address.
func TestListenUnixErrors(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // a gateway that died: the file stays, nobody accepts
	if l, err := Listen("unix:" + stale); err != nil {
		t.Errorf("stale socket: %v", err)
	} else {
		live := "unix:" + stale
		if _, err := Listen(live); err == nil || !strings.Contains(err.Error(), "another server listens on") {
			t.Errorf("socket in use: %v", err)
		}
		l.Close()
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ addr, want string }{
		{"unix:" + file, "listen unix:" + file + ": " + file + " exists and is not a socket"},
		{"unix:", "listen unix:: want unix:PATH"},
		{"127.0.0.1:99999", "listen 127.0.0.1:99999: "},
	} {
		_, err := Listen(c.addr)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Listen(%q) = %v, want an error starting %q", c.addr, err, c.want)
		}
	}
}
