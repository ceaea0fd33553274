package livelab

import (
	"fmt"
	"testing"
	"time"

	"sluice/storage"
)

// StatusWithin bounds how long WaitDisk waits for a gateway status: a
// harness bound (a gateway that writes none is broken), far longer than
// any control period.
const StatusWithin = time.Minute

// WaitDisk polls the gateway status file (written every control period)
// until a record whose period ended after `after` shows disk with cond
// true, and returns the disk's status (a zero one, counters 0, while the
// gateway does not list the disk). Its counters tell a test how far a
// client got (WritesTotal: writes completed), so that faults come by
// progress.
func WaitDisk(t testing.TB, statusFile, disk string, after time.Time, cond func(storage.DiskStatus) bool) storage.DiskStatus {
	t.Helper()
	deadline := time.Now().Add(StatusWithin)
	last := "no status"
	for {
		st, err := storage.ReadStatusFile(statusFile)
		switch {
		case err != nil:
			last = err.Error()
		case !time.Unix(0, st.TimeUnixNs).After(after):
			last = fmt.Sprintf("the last status is of %s", time.Unix(0, st.TimeUnixNs).Format("15:04:05.000"))
		default:
			d := storage.DiskStatus{Disk: disk}
			for _, x := range st.Disks {
				if x.Disk == disk {
					d = x
				}
			}
			if cond(d) {
				return d
			}
			last = fmt.Sprintf("%d writes completed, %d outstanding at %s", d.WritesTotal, d.Outstanding, time.Unix(0, st.TimeUnixNs).Format("15:04:05.000"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not report what the test waits for within %v (%s)", disk, statusFile, StatusWithin, last)
		}
		time.Sleep(50 * time.Millisecond) // polling another process's status file, with a deadline
	}
}

// AnyDisk is a WaitDisk condition that any record meets.
func AnyDisk(storage.DiskStatus) bool { return true }
