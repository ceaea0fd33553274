package virtstorage

import (
	"context"
	"strings"
	"testing"
	"time"

	"sluice/livetest/livelab"
	"sluice/storage"
)

// One host, one guest whose disk (64 MiB) lives on a datastore of 4 slots
// × 2 ms (2000 IOPS: more than a TCG guest issues, so fio's writes take
// seconds and the gateway or the datastore can be killed in the middle).
const crashPolicy = `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}
    array: {slots: 4, serviceTime: 2ms}
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, disks: [{name: d0, datastore: ds1, size: 64MiB}]}
`

// verifiedWrite is fio inside the guest: 4 KiB random writes with crc32c
// verify headers, direct I/O on the guest's virtio disk at queue depth 8,
// each block written once, then every block read back and verified
// (do_verify). fio's verify state goes to the guest's /tmp, so that a
// second run can verify what the first saw acknowledged.
func verifiedWrite(offset, size string) []string {
	return []string{"name=w", "filename=/dev/vda", "direct=1", "ioengine=libaio", "iodepth=8", "rw=randwrite", "bs=4k",
		"offset=" + offset, "size=" + size, "verify=crc32c", "do_verify=1", "verify_state_save=1", "randrepeat=1"}
}

// minAcked is how many of fio's writes the gateway must have completed
// before the kill: the kill comes by fio's progress, not by the clock.
const minAcked = 1500

// crashRateIOPS paces fio's writes (8192 of them), so that the kill,
// which comes within a control period (1 s) of the gateway seeing
// minAcked writes, lands with thousands of writes still to come on a
// machine of any speed.
const crashRateIOPS = "rate_iops=1000"

// TestGuestStorageCrash runs fio with verify inside a QEMU guest whose disk
// is attached to its host's gateway (NBD on the VM's socket, QEMU's
// reconnect delay 30 s), and once the gateway completed minAcked of fio's
// writes:
//
//   - kills the gateway with SIGKILL and starts it again with the same
//     command line: QEMU reconnects and resends what was in flight, so fio
//     sees no error and verifies every block (no acknowledged write lost);
//     the new gateway completing writes proves fio was still writing;
//   - kills the datastore (nbdkit) with SIGKILL and starts it again once
//     the gateway's status shows the outage (its counters frozen, the
//     disk's requests waiting): fio either sees no error and verifies
//     every block, or sees an I/O error (the VM was told), after which
//     every block whose write it saw acknowledged still verifies. A verify
//     error is a silent loss. Writes completed after the outage prove fio
//     was still writing.
func TestGuestStorageCrash(t *testing.T) {
	l := upLab(t, "vsc", crashPolicy)
	socket := storage.VMSocket(storage.SocketDir(l.P.Cluster, "h1"), "vm1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ds := l.process("nbdkit:ds1")
	machine := livelab.WatchMachine(t)

	t.Run("gateway SIGKILL", func(t *testing.T) {
		gw := l.process("gateway:h1")
		job := append(verifiedWrite("0", "32M"), crashRateIOPS)
		t0 := time.Now()
		base := l.diskStatus(t, time.Time{}, livelab.AnyDisk).WritesTotal
		pid, err := l.StartFio(ctx, "vm1", job...)
		if err != nil {
			t.Fatal(err)
		}
		at := l.diskStatus(t, t0, func(d storage.DiskStatus) bool { return d.WritesTotal >= base+minAcked })
		livelab.KillPID(t, gw.PID)
		killed := time.Now()
		l.restartGateway(gw, socket, &ds)
		t.Logf("the gateway had completed %d of fio's writes %v after its start (%d outstanding); killed (SIGKILL) and serving again %v later",
			at.WritesTotal-base, killed.Sub(t0).Round(time.Millisecond), at.Outstanding, time.Since(killed).Round(time.Millisecond))
		r := l.WaitFio(ctx, "vm1", pid)
		ended := time.Now()
		t.Logf("fio: %d writes (%.0f IOPS, %d ms), %d verification reads, exit %d, job error %d, guest CPU usr %.0f%% sys %.0f%%; %s",
			r.WriteIOs, r.WriteIOPS, r.WriteRuntimeMs, r.ReadIOs, r.Exit, r.JobError, r.UsrCPU, r.SysCPU, machine.Between(t0, ended))
		if r.Err != nil || r.JobError != 0 {
			t.Fatalf("fio in the guest failed across the gateway's SIGKILL (QEMU should have reconnected): %v %s", r.Err, tail(r.Stderr, 10))
		}
		if r.VerifyErrorsReported {
			t.Errorf("fio reports verify errors: %s", tail(r.Stderr, 10))
		}
		if r.WriteKiB != 32<<10 || r.ReadKiB != 32<<10 {
			t.Errorf("fio wrote %d KiB and verified %d KiB, want 32768 each", r.WriteKiB, r.ReadKiB)
		}
		// Every write the new gateway completed came after the kill.
		after := l.diskStatus(t, ended, livelab.AnyDisk)
		t.Logf("the new gateway completed %d of fio's writes after the kill", after.WritesTotal)
		if after.WritesTotal == 0 {
			t.Errorf("the new gateway completed none of fio's writes: they had all ended before the kill, nothing tested")
		}
	})

	t.Run("datastore restart", func(t *testing.T) {
		job := append(verifiedWrite("32M", "32M"), crashRateIOPS)
		t0 := time.Now()
		base := l.diskStatus(t, time.Time{}, livelab.AnyDisk).WritesTotal
		pid, err := l.StartFio(ctx, "vm1", job...)
		if err != nil {
			t.Fatal(err)
		}
		at := l.diskStatus(t, t0, func(d storage.DiskStatus) bool { return d.WritesTotal >= base+minAcked })
		livelab.KillPID(t, ds.PID)
		killed := time.Now()
		// A period that began after the kill: its counters are those of
		// the outage, when no write can complete.
		down := l.diskStatus(t, killed, livelab.AnyDisk)
		ds = livelab.RestartDatastore(t, ds)
		t.Logf("the gateway had completed %d of fio's writes %v after its start; datastore killed (SIGKILL); during the outage %d writes completed in all and %d requests of the disk waited; listening again %v after the kill",
			at.WritesTotal-base, killed.Sub(t0).Round(time.Millisecond), down.WritesTotal-base, down.Outstanding, time.Since(killed).Round(time.Millisecond))
		r := l.WaitFio(ctx, "vm1", pid)
		ended := time.Now()
		t.Logf("fio: %d writes, %d verification reads, exit %d, job error %d: %s; %s", r.WriteIOs, r.ReadIOs, r.Exit, r.JobError, tail(r.Stderr, 5), machine.Between(t0, ended))
		after := l.diskStatus(t, ended, livelab.AnyDisk)
		t.Logf("the gateway completed %d of fio's writes after the outage", after.WritesTotal-down.WritesTotal)
		if after.WritesTotal <= down.WritesTotal {
			t.Errorf("no write of fio's completed after the datastore's outage: fio's writes had ended before the kill, nothing tested")
		}
		if r.VerifyErrorsReported {
			t.Fatalf("acknowledged writes lost silently across the datastore's restart: fio's verify failed with no I/O error seen: %s", tail(r.Stderr, 10))
		}
		if r.Err == nil && r.JobError == 0 {
			if r.WriteKiB != 32<<10 || r.ReadKiB != 32<<10 {
				t.Errorf("fio wrote %d KiB and verified %d KiB, want 32768 each", r.WriteKiB, r.ReadKiB)
			}
			return
		}
		if !strings.Contains(r.Stderr, "Input/output error") && r.JobError != 5 {
			t.Fatalf("fio failed without an I/O error: %v: %s", r.Err, tail(r.Stderr, 10))
		}
		// The guest saw an I/O error: what fio saw acknowledged must
		// verify. fio's verify state covers the writes it issued, those
		// it saw fail too: a wrong block is a loss unless its write
		// failed.
		failed := livelab.FailedWrites(r.Stderr)
		v := l.GuestFio(ctx, "vm1", append(job, "verify_only=1", "verify_state_load=1")...)
		bad := livelab.BadBlocks(v.Stderr)
		var lost []int64
		for _, off := range bad {
			if !failed[off] {
				lost = append(lost, off)
			}
		}
		t.Logf("after the I/O error (%d writes reported failed), fio verified %d blocks: exit %d, %d wrong, of which %d whose write had not failed: %s",
			len(failed), v.ReadIOs, v.Exit, len(bad), len(lost), tail(v.Stderr, 5))
		if len(lost) > 0 {
			t.Errorf("acknowledged writes lost across the datastore's restart: %d blocks wrong whose write the guest did not see fail (offsets %v)", len(lost), lost)
		}
		if v.ReadIOs == 0 || (v.Err != nil && len(bad) == 0) {
			t.Errorf("fio could not verify after the datastore's restart: %v: %s", v.Err, tail(v.Stderr, 10))
		}
	})
}

// diskStatus is livelab.WaitDisk of vm1/d0 on h1's gateway.
func (l *guestLab) diskStatus(t *testing.T, after time.Time, cond func(storage.DiskStatus) bool) storage.DiskStatus {
	t.Helper()
	return livelab.WaitDisk(t, l.statusFile("h1"), "vm1/d0", after, cond)
}
