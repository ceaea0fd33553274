// Package cputime reads the CPU time (user + system) that this process or
// the calling OS thread has used. Benchmarks report it per op next to wall
// time: on a shared, loaded machine wall-clock ns/op also counts the time
// the benchmark waited for a CPU.
package cputime

import "syscall"

// rusageThread is RUSAGE_THREAD (Linux), which package syscall does not name.
const rusageThread = 1

// ProcessNs is the CPU time this process has used, in ns (0 if unknown).
func ProcessNs() int64 { return usage(syscall.RUSAGE_SELF) }

// ThreadNs is the CPU time the calling OS thread has used, in ns (0 if
// unknown); lock the goroutine to its thread around the measurement.
func ThreadNs() int64 { return usage(rusageThread) }

func usage(who int) int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
