package storage

import (
	"fmt"
	"time"

	"sluice/policy"
)

// Array is a datastore device emulated by nbdkit (the lab's datastore and
// the live tests'): the volume files of directory Dir (one export per
// file, nbdkit's file plugin with dir=; CreateVolumes prepares it), whose
// requests each take ServiceTime and that serves at most CapacityIOPS
// 4 KiB I/Os per second across all connections and exports together, a
// larger I/O costing in proportion to its size. Latency therefore grows
// with the total outstanding I/O of all hosts, as on a shared array.
type Array struct {
	CapacityIOPS float64       // 0: unbounded (an uncongested datastore)
	ServiceTime  time.Duration // 0: none; nbdkit's delay filter counts whole ms
	Threads      int           // nbdkit threads per connection (default 64)
	Dir          string        // the directory of volumes
}

// ArrayOf is the emulation of a policy array of Slots parallel slots, each
// taking ServiceTime per 4 KiB I/O (capacity Slots/ServiceTime), serving
// the volumes in dir.
func ArrayOf(a policy.Array, dir string) Array {
	e := Array{ServiceTime: a.ServiceTime, Dir: dir}
	if a.Slots > 0 && a.ServiceTime > 0 {
		e.CapacityIOPS = float64(a.Slots) / a.ServiceTime.Seconds()
	}
	return e
}

// NbdkitArgs returns nbdkit's arguments for the array: threads, filters,
// plugin and its parameters; the caller adds where to listen. The rate
// filter is outermost, so it meters all connections together (nbdkit's -t
// is per connection: threads alone would give each host its own slots).
func (a Array) NbdkitArgs() []string {
	threads := a.Threads
	if threads <= 0 {
		threads = 64
	}
	delayMs := (a.ServiceTime + time.Millisecond/2) / time.Millisecond
	args := []string{"-t", fmt.Sprint(threads)}
	if a.CapacityIOPS > 0 {
		args = append(args, "--filter=rate")
	}
	if delayMs > 0 {
		args = append(args, "--filter=delay")
	}
	args = append(args, "file", "dir="+a.Dir)
	if a.CapacityIOPS > 0 {
		args = append(args, fmt.Sprintf("rate=%d", int64(a.CapacityIOPS*4096*8)), "burstiness=0.1")
	}
	if delayMs > 0 {
		d := fmt.Sprintf("%dms", delayMs)
		args = append(args, "rdelay="+d, "wdelay="+d)
	}
	return args
}
