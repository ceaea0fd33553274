package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/controller"
	"sluice/entitle"
	"sluice/policy"
	"sluice/policyfile"
	"sluice/storage"
	"sluice/storage/nbd"
)

const followPolicyYAML = `cluster: gwf
hosts:
  - {name: h1, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, uplinks: [{name: up0, speed: 1Gbps}]}
datastores:
  - {name: ds1}
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: ds1, size: 1MiB}]}
  - {name: vm2, host: h1, disks: [{name: d0, datastore: ds1, size: 1MiB}]}
`

// The gateway follows its policy file: when vm2 moves to h2 in the file,
// h1's gateway stops serving its disk without a restart, and serves it
// again when it comes back.
func TestGatewayFollowsPolicyFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(followPolicyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	stamp := policyfile.Stamp(file)
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "ds1")
	os.Mkdir(vols, 0o700)
	if _, err := storage.CreateVolumes(vols, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	g, err := storage.New(storage.Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "dir:" + vols}, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	socks := filepath.Join(dir, "socks")
	vs := storage.NewVMSockets(g, socks, storage.DefaultSocketPerm)
	if err := vs.Sync(); err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	w := &policyfile.Watch{Path: file, From: stamp, Every: 10 * time.Millisecond,
		Apply: func(p *policy.Policy) error { return applyPolicy(g, vs, p, discardLog) }}
	defer follow(w.Run)()
	vm2Sock := func() bool { _, err := os.Stat(storage.VMSocket(socks, "vm2")); return err == nil }
	waitExports := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Join(g.Exports(), " ") != want {
			if time.Now().After(deadline) {
				t.Fatalf("gateway serves %q, want %q", strings.Join(g.Exports(), " "), want)
			}
			time.Sleep(5 * time.Millisecond) // polling the gateway's exports
		}
	}
	waitExports("vm1/d0 vm2/d0")
	moved := strings.Replace(followPolicyYAML, "{name: vm2, host: h1", "{name: vm2, host: h2", 1)
	if err := os.WriteFile(file, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	waitExports("vm1/d0")
	waitSock := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for vm2Sock() != want {
			if time.Now().After(deadline) {
				t.Fatalf("vm2's socket there: %v, want %v", !want, want)
			}
			time.Sleep(5 * time.Millisecond) // polling the socket directory
		}
	}
	waitSock(false) // the socket goes after the disk
	// A broken file changes nothing.
	if err := os.WriteFile(file, []byte("cluster: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // several reload intervals: nothing may change
	waitExports("vm1/d0")
	if err := os.WriteFile(file, []byte(followPolicyYAML+"# back\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitExports("vm1/d0 vm2/d0")
	waitSock(true)
}

// `sluice gateway` on a host without VMs keeps running and serves a VM
// that the policy file moves there: its socket appears and opens its disk;
// SIGTERM stops it.
func TestGatewayCommandWaitsForVMs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(followPolicyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "ds1")
	os.Mkdir(vols, 0o700)
	if _, err := storage.CreateVolumes(vols, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	socks := filepath.Join(dir, "socks")
	var stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"gateway", "--host", "h2", "--policy", file, "--datastore", "ds1=dir:" + vols,
			"--socket-dir", socks, "--reload", "20ms", "--status-file", filepath.Join(dir, "status.json")}, io.Discard, &stderr)
	}()
	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			select {
			case c := <-code:
				t.Fatalf("gateway exited %d: %s", c, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 20 s: %s", what, stderr.String())
			}
			time.Sleep(10 * time.Millisecond) // polling the command, with a deadline
		}
	}
	wait("serving", func() bool { return strings.Contains(stderr.String(), "serving") })
	moved := strings.Replace(followPolicyYAML, "{name: vm2, host: h1", "{name: vm2, host: h2", 1)
	if err := os.WriteFile(file, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := storage.VMSocket(socks, "vm2")
	wait("vm2's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "unix", sock, "vm2/d0")
	if err != nil {
		t.Fatalf("vm2 opens its disk on its new socket: %v", err)
	}
	if err := c.WriteAt(make([]byte, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	c.Close()
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
}

// The gateway follows the controller: the VMs of the host's part of the
// policy in its desired state are the ones it serves, whatever the policy
// document says; it never asks for the whole policy (an HTTP stand-in
// answers the desired state only; the real controller is exercised in
// livetest/ctllive).
func TestGatewayFollowsController(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(followPolicyYAML))
	if err != nil {
		t.Fatal(err)
	}
	on := func(rev int64, place map[string]string) controller.DesiredHost {
		part := entitle.HostParts(p, place, nil)["h2"]
		d := controller.DesiredHost{Host: "h2", Revision: rev, VMs: []string{}, Policy: part}
		for _, vm := range part.VMs {
			d.VMs = append(d.VMs, vm.Name)
		}
		return d
	}
	var mu sync.Mutex
	desired := on(1, map[string]string{"vm1": "h1", "vm2": "h2"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"error": "unauthorized"}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/hosts/h2/desired":
			after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
			deadline := time.Now().Add(200 * time.Millisecond) // a short long poll
			for {
				mu.Lock()
				d := desired
				mu.Unlock()
				if d.Revision > after || time.Now().After(deadline) {
					json.NewEncoder(w).Encode(d)
					return
				}
				time.Sleep(5 * time.Millisecond) // the stand-in's long poll
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cl := &controller.Client{Server: srv.URL, Token: "tok", HTTP: srv.Client()}

	dir := t.TempDir()
	vols := filepath.Join(dir, "ds1")
	os.Mkdir(vols, 0o700)
	if _, err := storage.CreateVolumes(vols, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	g, err := storage.New(storage.Options{Host: "h2", Policy: p, Datastores: map[string]string{"ds1": "dir:" + vols}, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w := &controller.Watch{Client: cl, Host: "h2",
		Apply: func(d controller.DesiredHost) error { return applyDesired(g, nil, d, discardLog) }}
	defer follow(w.Run)()
	waitExports := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Join(g.Exports(), " ") != want {
			if time.Now().After(deadline) {
				t.Fatalf("gateway serves %q, want %q", strings.Join(g.Exports(), " "), want)
			}
			time.Sleep(5 * time.Millisecond) // polling the gateway's exports
		}
	}
	waitExports("vm2/d0") // the policy has vm2 on h1; the controller put it on h2
	mu.Lock()
	desired = on(2, map[string]string{"vm1": "h2", "vm2": "h1"})
	mu.Unlock()
	waitExports("vm1/d0")
}

// follow starts a follower's Run and returns the function that stops it.
func follow(run func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// discardLog is a daemon's logger that writes nowhere.
var discardLog = slog.New(slog.DiscardHandler)
