package crash

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
)

// A lab of one host and one VM whose disk lives on a datastore of 4 slots
// × 2 ms (about 2000 IOPS): fio's writes take seconds, so the gateway can
// be killed in the middle of them.
const gatewayPolicy = `cluster: ckg
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}
    array: {slots: 4, serviceTime: 2ms}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1, size: 64MiB}]}
`

// minAcked is how many writes fio must report done before a kill: the
// kill comes by fio's progress, not by the clock.
const minAcked = 1500

// TestGatewayKilledMidWrite: in a lab from `sluice lab up`, fio in vm1
// writes 16 MiB with verify headers and finishes (flushed); a second fio
// writes 32 MiB more, and the host's gateway is killed with SIGKILL once
// fio reports minAcked of its 8192 writes done. fio sees its writes fail. A new gateway is started with
// the same command line; fio then verifies through it the first 16 MiB
// entirely and the second part as far as it had written (its verify
// state). A wrong block is allowed only where fio's write was not
// acknowledged (not in its completion log).
func TestGatewayKilledMidWrite(t *testing.T) {
	requireLive(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(gatewayPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	sluice := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(sluiceBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	_ = exec.Command(sluiceBin, "lab", "down", file, "--state-dir", state).Run() // a leftover of a crashed run
	t.Cleanup(func() {
		if out, err := exec.Command(sluiceBin, "lab", "down", file, "--state-dir", state).CombinedOutput(); err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
		if left := lab.Existing("ckg"); len(left) > 0 {
			t.Errorf("lab down left namespaces behind: %v", left)
		}
	})
	sluice("lab", "up", file, "--state-dir", state)

	var status struct {
		Namespaces []struct {
			Name, Role string
			Disks      []struct{ URI string }
		}
	}
	if err := json.Unmarshal(sluice("lab", "status", file, "--state-dir", state, "-o", "json"), &status); err != nil {
		t.Fatalf("lab status -o json: %v", err)
	}
	var vmNS, uri string
	for _, ns := range status.Namespaces {
		if ns.Role == "vm" && len(ns.Disks) == 1 {
			vmNS, uri = ns.Name, ns.Disks[0].URI
		}
	}
	if uri == "" {
		t.Fatalf("lab status lists no disk: %+v", status.Namespaces)
	}
	st, err := lab.ReadState(state, "ckg")
	if err != nil || st == nil {
		t.Fatalf("lab state: %v", err)
	}
	gw, ok1 := st.Process("gateway:h1")
	ds, ok2 := st.Process("nbdkit:ds1")
	if !ok1 || !ok2 {
		t.Fatalf("lab state lists no gateway:h1 or nbdkit:ds1: %+v", st.Processes)
	}
	if err := serving(uri, 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	write := func(offset, size string) []string {
		return []string{"uri=" + uri, "rw=randwrite", "bs=4k", "iodepth=8", "offset=" + offset, "size=" + size,
			"verify=crc32c", "do_verify=0", "verify_state_save=1", "randrepeat=1"}
	}
	verify := func(offset, size string, fromState bool) []string {
		o := []string{"uri=" + uri, "rw=randwrite", "bs=4k", "iodepth=8", "offset=" + offset, "size=" + size,
			"verify=crc32c", "do_verify=1", "verify_only=1", "randrepeat=1"}
		if fromState {
			o = append(o, "verify_state_load=1")
		}
		return o
	}
	dirA, dirB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{dirA, dirB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if r := runFio(ctx, dirA, vmNS, append(write("0", "16M"), "end_fsync=1")...); r.Err != nil || r.JobError != 0 {
		t.Fatalf("fio writing the first 16 MiB: %v (job error %d): %s", r.Err, r.JobError, tailOf(r.Stderr))
	}

	// The second writer runs while the gateway is killed: once fio
	// reports minAcked of its 8192 writes done.
	during := startFio(ctx, dirB, vmNS, withAckLog(write("16M", "32M"))...)
	at := during.waitWrites(t, minAcked)
	killed := time.Now()
	livelab.KillPID(t, gw.PID)
	w := during.wait()
	t.Logf("fio writing during the kill: %d writes completed and %d issued at the kill (fio's report), %d in all, %d acknowledged, %d reported failed (%v, job error %d)",
		at.Write.KiB/4, at.Write.IOs, w.WriteIOs, len(w.Acked), len(w.FailedWrites), w.Err, w.JobError)
	if w.Acked == nil {
		t.Fatalf("fio's completion log of the interrupted writer: %v", w.Err)
	}
	if w.Err == nil && w.JobError == 0 {
		t.Fatal("fio saw no error although its gateway was killed: was the gateway killed?")
	}

	// The same gateway again, as a supervisor would start it (and the
	// datastore, if nbdkit's known abort took it down: RestartGateway).
	restartLog := filepath.Join(state, "gateway-restart.log")
	err = livelab.RestartGateway(t, &ds,
		func() <-chan struct{} { return startDaemon(t, gw.Namespace, restartLog, gw.Args...).done },
		func(exited <-chan struct{}) error { return serving(uri, 10*time.Second, exited) })
	if err != nil {
		log, _ := os.ReadFile(restartLog)
		t.Fatalf("the restarted gateway: %v; its log:\n%s", err, log)
	}
	t.Logf("gateway serving again %s after the SIGKILL", time.Since(killed).Round(time.Millisecond))

	a := runFio(ctx, dirA, vmNS, verify("0", "16M", false)...)
	b := runFio(ctx, dirB, vmNS, verify("16M", "32M", true)...)
	t.Logf("verified through the new gateway: %d blocks written before the kill (all), %d blocks of the interrupted writer (its verify state); wrong blocks: %v, %v",
		a.ReadIOs, b.ReadIOs, a.BadBlocks, b.BadBlocks)
	for _, r := range []fioRun{a, b} {
		if strings.Contains(r.Stderr, "io_u error") {
			t.Errorf("fio verify could not read through the new gateway: %s", tailOf(r.Stderr))
		}
	}
	if a.ReadIOs < 4096 {
		t.Errorf("verified %d of the first writer's 4096 blocks", a.ReadIOs)
	}
	if b.ReadIOs < 100 {
		t.Errorf("verified only %d blocks of the interrupted writer: nothing tested", b.ReadIOs)
	}
	if l := lost(a); len(l) > 0 {
		t.Errorf("the first 16 MiB, written and flushed before the kill: %d blocks wrong after the gateway's restart (offsets %v)", len(l), l)
	}
	if l := lost(b, w); len(l) > 0 {
		t.Errorf("acknowledged writes lost in the gateway's SIGKILL: %d blocks wrong whose write fio had completed (offsets %v; writes fio reported failed: %d)", len(l), l, len(w.FailedWrites))
	}
}
