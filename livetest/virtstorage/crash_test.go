package virtstorage

import (
	"context"
	"fmt"
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

// TestGuestStorageCrash runs fio with verify inside a QEMU guest whose disk
// is attached to its host's gateway (NBD on the VM's socket, QEMU's
// reconnect delay 30 s), and in the middle of the writes:
//
//   - kills the gateway with SIGKILL and starts it again with the same
//     command line: QEMU reconnects and resends what was in flight, so fio
//     sees no error and verifies every block (no acknowledged write lost);
//   - kills the datastore (nbdkit) with SIGKILL and starts it again: fio
//     either sees no error and verifies every block, or sees an I/O error
//     (the VM was told), after which every block whose write it saw
//     acknowledged still verifies. A verify error is a silent loss.
func TestGuestStorageCrash(t *testing.T) {
	l := upLab(t, "vsc", crashPolicy)
	socket := storage.VMSocket(storage.SocketDir(l.p.Cluster, "h1"), "vm1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ds := l.process("nbdkit:ds1")

	t.Run("gateway SIGKILL", func(t *testing.T) {
		gw := l.process("gateway:h1")
		job := verifiedWrite("0", "32M")
		t0 := time.Now()
		pid, err := l.startFio(ctx, "vm1", job...)
		if err != nil {
			t.Fatal(err)
		}
		busy := l.waitDiskIOs(t, "h1", "vm1/d0", t0, 1500, 60*time.Second)
		livelab.KillPID(t, gw.PID)
		killed := time.Now()
		l.restartGateway(gw, socket, &ds)
		t.Logf("fio had done ≥ 1500 I/Os at the gateway %v after its start; gateway killed (SIGKILL) and serving again %v later",
			busy.Sub(t0).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
		r := l.waitFio(ctx, "vm1", pid)
		t.Logf("fio: %d writes (%.0f IOPS, %d ms), %d verification reads, exit %d, job error %d, guest CPU usr %.0f%% sys %.0f%%; load %s",
			r.WriteIOs, r.WriteIOPS, r.WriteRuntimeMs, r.ReadIOs, r.Exit, r.JobError, r.UsrCPU, r.SysCPU, loadavg())
		if r.Err != nil || r.JobError != 0 {
			t.Fatalf("fio in the guest failed across the gateway's SIGKILL (QEMU should have reconnected): %v %s", r.Err, tail(r.Stderr, 10))
		}
		if r.VerifyErrorsReported {
			t.Errorf("fio reports verify errors: %s", tail(r.Stderr, 10))
		}
		if r.WriteKiB != 32<<10 || r.ReadKiB != 32<<10 {
			t.Errorf("fio wrote %d KiB and verified %d KiB, want 32768 each", r.WriteKiB, r.ReadKiB)
		}
		// fio's write phase began after t0 and lasted WriteRuntimeMs: it
		// was still writing at the kill if it ended after it.
		if end := t0.Add(time.Duration(r.WriteRuntimeMs) * time.Millisecond); !end.After(killed) {
			t.Errorf("fio's writes (%d ms from at the earliest %v) ended before the kill: nothing tested", r.WriteRuntimeMs, t0.Format("15:04:05.000"))
		}
	})

	t.Run("datastore restart", func(t *testing.T) {
		job := verifiedWrite("32M", "32M")
		t0 := time.Now()
		pid, err := l.startFio(ctx, "vm1", job...)
		if err != nil {
			t.Fatal(err)
		}
		busy := l.waitDiskIOs(t, "h1", "vm1/d0", t0, 1500, 60*time.Second)
		livelab.KillPID(t, ds.PID)
		killed := time.Now()
		ds = livelab.RestartDatastore(t, ds)
		t.Logf("fio had done ≥ 1500 I/Os at the gateway %v after its start; datastore killed (SIGKILL) and listening again %v later",
			busy.Sub(t0).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
		r := l.waitFio(ctx, "vm1", pid)
		t.Logf("fio: %d writes, %d verification reads, exit %d, job error %d: %s", r.WriteIOs, r.ReadIOs, r.Exit, r.JobError, tail(r.Stderr, 5))
		if end := t0.Add(time.Duration(r.WriteRuntimeMs) * time.Millisecond); r.WriteRuntimeMs > 0 && !end.After(killed) {
			t.Errorf("fio's writes (%d ms) ended before the kill: nothing tested", r.WriteRuntimeMs)
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
		// The guest saw an I/O error: what fio saw acknowledged must verify.
		v := l.guestFio(ctx, "vm1", append(job, "verify_only=1", "verify_state_load=1")...)
		t.Logf("after the I/O error, fio verified %d blocks it saw acknowledged: exit %d: %s", v.ReadIOs, v.Exit, tail(v.Stderr, 5))
		if v.VerifyErrorsReported || v.Err != nil {
			t.Errorf("acknowledged writes lost across the datastore's restart (the guest saw an I/O error, but blocks it saw acknowledged do not verify): %v: %s", v.Err, tail(v.Stderr, 10))
		}
	})
}

// waitDiskIOs polls host's gateway status (one record per control period)
// until disk completed at least n I/Os in periods that began after since,
// and returns when it saw that.
func (l *guestLab) waitDiskIOs(t *testing.T, host, disk string, since time.Time, n float64, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	seen := map[int64]bool{}
	done := 0.0
	last := ""
	for {
		st, err := l.gatewayStatus(host)
		begin := time.Unix(0, st.TimeUnixNs).Add(-time.Duration(st.PeriodS * 1e9))
		if err != nil {
			last = err.Error()
		} else if !seen[st.TimeUnixNs] && begin.After(since) {
			seen[st.TimeUnixNs] = true
			for _, d := range st.Disks {
				if d.Disk == disk {
					done += d.IOPS * st.PeriodS
				}
			}
			last = fmt.Sprintf("%.0f I/Os in %d periods", done, len(seen))
			if done >= n {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: fewer than %.0f I/Os at the gateway of %s within %v (%s)", disk, n, host, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
