package ctllive

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/livetest/livelab"
	"sluice/storage"
)

// diskPolicy: two hosts, one VM whose disk lives on a directory datastore
// that both hosts' gateways open (seed 002's shared datastore).
const diskPolicy = `# A VM with a disk on a shared datastore (livetest/ctllive).
cluster: cdsk
hosts:
  - name: h1
    cpu: {cores: 16, mhz: 2600}
    memory: 128GiB
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    cpu: {cores: 16, mhz: 2600}
    memory: 128GiB
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1, size: 64MiB}]}
`

// TestDiskFollowsMigration: the real controller and one real `sluice
// gateway --controller` per host, both on the same directory datastore.
// fio writes 16 MiB of vm1's disk through h1's gateway (the VM's socket
// there), with verify headers and no flush; `ctl migrate vm1 --to h2`;
// h1's gateway lets the disk go (its socket for vm1 disappears) and h2's
// serves it (a socket for vm1 appears), with no data copied; fio then
// verifies every block through h2's socket.
func TestDiskFollowsMigration(t *testing.T) {
	requireLive(t)
	dir := t.TempDir()
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(diskPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "ds1")
	if err := os.Mkdir(vols, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "datastore", "create", "--policy", polFile, "ds1="+vols).CombinedOutput(); err != nil {
		t.Fatalf("datastore create: %v: %s", err, out)
	}

	data := filepath.Join(dir, "data")
	port := livelab.FreePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	startController(t, data, []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port)})
	conn := []string{"--server", server, "--data-dir", data}
	ctl(t, conn, 0, "apply", "-f", polFile)

	sock := map[string]string{}
	for _, h := range []string{"h1", "h2"} {
		sdir := filepath.Join(dir, "gw-"+h)
		sock[h] = filepath.Join(sdir, "vm1.sock")
		startSluice(t, dir, "gateway-"+h, syscall.SIGTERM, "gateway", "--host", h, "--controller", server, "--token-file", filepath.Join(data, "token"),
			"--ca", filepath.Join(data, "tls", "cert.pem"), "--datastore", "ds1=dir:"+vols,
			"--socket-dir", sdir, "--status-file", filepath.Join(dir, "gw-"+h+".json"), "--period", "250ms")
	}
	waitSocketState(t, sock["h1"], true, 15*time.Second)
	if _, err := os.Stat(sock["h2"]); err == nil {
		t.Fatalf("h2's gateway has a socket for vm1 before the migration")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job := func(host string) []string {
		return []string{"--name=mv", "--ioengine=nbd", "--uri=nbd+unix:///vm1/d0?socket=" + sock[host], "--rw=randwrite", "--bs=4k",
			"--iodepth=8", "--size=16M", "--verify=crc32c", "--randrepeat=1", "--output-format=json"}
	}
	w := fioJSON(ctx, t, dir, append(job("h1"), "--do_verify=0")...)
	if w.Write.IOs != 4096 {
		t.Fatalf("fio wrote %d blocks through h1's gateway, want 4096", w.Write.IOs)
	}

	start := time.Now()
	ctl(t, conn, 0, "migrate", "vm1", "--to", "h2", "--reason", "disk follows the VM")
	waitSocketState(t, sock["h2"], true, 15*time.Second)
	arrived := time.Since(start)
	waitSocketState(t, sock["h1"], false, 15*time.Second)
	t.Logf("ctl migrate to h2's gateway serving vm1/d0: %v; h1's socket for vm1 gone %v after the migrate",
		arrived.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	v := fioJSON(ctx, t, dir, append(job("h2"), "--do_verify=1", "--verify_only=1")...)
	t.Logf("verified through h2's gateway: %d blocks", v.Read.IOs)
	if v.Read.IOs != 4096 {
		t.Errorf("fio verified %d blocks through h2's gateway, want 4096 (all written through h1's, unflushed)", v.Read.IOs)
	}

	// Each disk field of ctl set reaches the gateway that serves the disk
	// within 1 s (its status, every 250 ms: a record newer than the set
	// holds the new value).
	for _, f := range []struct {
		set string
		ok  func(storage.DiskStatus) bool
	}{
		{"reservation=200", func(d storage.DiskStatus) bool { return d.ReservationIOPS == 200 }},
		{"shares=high", func(d storage.DiskStatus) bool { return d.Shares == 2000 }},
		{"limit=1500", func(d storage.DiskStatus) bool { return d.LimitIOPS == 1500 }},
	} {
		t0 := time.Now()
		ctl(t, conn, 0, "set", "vm1/d0", f.set)
		d := livelab.WaitDisk(t, filepath.Join(dir, "gw-h2.json"), "vm1/d0", t0, f.ok)
		t.Logf("ctl set vm1/d0 %s: in h2's gateway's status of %s, %v after the set", f.set, time.Now().Format("15:04:05.000"), time.Since(t0).Round(time.Millisecond))
		if took := time.Since(t0); took > time.Second+250*time.Millisecond {
			t.Errorf("ctl set vm1/d0 %s reached h2's gateway %v after it (status %+v), want ≤ 1 s (+ the status's period)", f.set, took.Round(time.Millisecond), d)
		}
	}
}

// fioJSON runs one fio job in dir and returns its report; a failed run or
// a verify error fails the test.
func fioJSON(ctx context.Context, t *testing.T, dir string, args ...string) livelab.FioJob {
	t.Helper()
	cmd := exec.CommandContext(ctx, "fio", args...)
	cmd.Dir = dir
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	j, jerr := livelab.ParseFioJob(out.Bytes())
	if err != nil || jerr != nil || j.Error != 0 {
		t.Fatalf("fio %s: %v (%v, job error %d): %s %s", strings.Join(args, " "), err, jerr, j.Error, tailOf(stderr.String()), tailOf(out.String()))
	}
	return j
}

func tailOf(s string) string {
	if len(s) > 600 {
		return "…" + s[len(s)-600:]
	}
	return s
}

// waitSocketState waits until the Unix socket at path accepts a connection
// (up) or no longer exists (down).
func waitSocketState(t *testing.T, path string, up bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if up {
			if c, err := net.Dial("unix", path); err == nil {
				c.Close()
				return
			}
		} else if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s not %s within %v", path, map[bool]string{true: "accepting", false: "gone"}[up], within)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's socket, with a deadline
	}
}
