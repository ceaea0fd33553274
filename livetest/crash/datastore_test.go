package crash

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/livetest/livelab"
	"sluice/policy"
	"sluice/storage"
)

const datastorePolicy = `cluster: ckd
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1, size: 64MiB}]}
`

// TestDatastoreRestartMidWrite: a gateway (the sluice binary) serves vm1's
// disk from a datastore that keeps its data across a restart, as an array
// does (nbdkit's file plugin serving a directory of volumes). fio writes 48 MiB with verify headers through
// the gateway; once fio reports minAcked writes done the datastore is killed
// with SIGKILL, stays down until the gateway's status shows the outage and
// is started again. The gateway reconnects and
// retries, so fio should see only latency; either way every block whose
// write fio saw succeed must verify afterwards (fio's own verify pass, or,
// when fio saw an error, a verify of what its state says it wrote).
func TestDatastoreRestartMidWrite(t *testing.T) {
	requireLive(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(datastorePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(file)
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
	dsSock, gwSock := filepath.Join(dir, "ds1.sock"), filepath.Join(dir, "gw.sock")
	statusFile := filepath.Join(dir, "gateway.json")
	nbdkit := func() *daemon {
		_ = os.Remove(dsSock) // a killed nbdkit leaves its socket
		d := startDaemon(t, "", filepath.Join(dir, "nbdkit.log"), "nbdkit", "-f", "-U", dsSock, "-t", "8",
			"--filter=delay", "file", "dir="+vols, "rdelay=2ms", "wdelay=2ms")
		waitSocket(t, dsSock, 10*time.Second)
		return d
	}
	ds := nbdkit()
	startDaemon(t, "", filepath.Join(dir, "gateway.log"), sluiceBin, "gateway", "--host", "h1", "--policy", file,
		"--datastore", "ds1=nbd+unix:///?socket="+dsSock, "--listen", "unix:"+gwSock, "--period", "500ms",
		"--status-file", statusFile, "--socket-dir", filepath.Join(dir, "gw"))
	waitSocket(t, gwSock, 10*time.Second)
	uri := "nbd+unix:///vm1/d0?socket=" + gwSock

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job := []string{"uri=" + uri, "rw=randwrite", "bs=4k", "iodepth=8", "size=48M", "verify=crc32c", "randrepeat=1"}
	during := startFio(ctx, dir, "", withAckLog(append(job, "do_verify=1", "verify_state_save=1"))...)
	at := during.waitWrites(t, minAcked)
	ds.kill()
	killed := time.Now()
	// The datastore stays down until the gateway's status shows the
	// outage: a period that began after the kill, in which no write can
	// complete and fio's wait in the gateway, which retries.
	down := livelab.WaitDisk(t, statusFile, "vm1/d0", killed, livelab.AnyDisk)
	nbdkit()
	t.Logf("datastore killed (SIGKILL) after fio reported %d of its %d writes completed (%d issued); during the outage the gateway had completed %d writes and %d requests waited; serving again after %s",
		at.Write.KiB/4, 48<<20/4096, at.Write.IOs, down.WritesTotal, down.Outstanding, time.Since(killed).Round(time.Millisecond))
	w := during.wait()
	t.Logf("fio: %d writes (%d acknowledged), %d verification reads, %d writes reported failed (%v, job error %d)", w.WriteIOs, len(w.Acked), w.ReadIOs, len(w.FailedWrites), w.Err, w.JobError)
	if gl, err := os.ReadFile(filepath.Join(dir, "gateway.log")); err == nil {
		t.Logf("gateway log:\n%s", tailOf(string(gl)))
	}
	if w.Err == nil && w.JobError == 0 {
		// fio wrote everything and verified it itself.
		if w.ReadIOs < 48<<20/4096 {
			t.Errorf("fio verified %d of its %d blocks", w.ReadIOs, 48<<20/4096)
		}
		if len(w.BadBlocks) > 0 {
			t.Errorf("acknowledged writes lost across the datastore's restart: %d wrong blocks (offsets %v)", len(w.BadBlocks), w.BadBlocks)
		}
		return
	}
	// fio saw an error: the client knows. What it saw succeed must be there.
	t.Logf("fio saw an error during the datastore restart: %s", tailOf(w.Stderr))
	v := runFio(ctx, dir, "", append(job, "do_verify=1", "verify_only=1", "verify_state_load=1")...)
	if strings.Contains(v.Stderr, "io_u error") {
		t.Fatalf("fio verify could not read through the gateway after the datastore's restart: %s", tailOf(v.Stderr))
	}
	if l := lost(v, w); len(l) > 0 {
		t.Errorf("acknowledged writes lost across the datastore's restart: %d blocks wrong whose write fio had completed (offsets %v)", len(l), l)
	}
}
