package cpuctl

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stats are the cumulative counters of one VM's cgroup. Take two and pass
// them to Rates for per-interval values.
type Stats struct {
	UsageNs     uint64 // CPU time used by the group (cpuacct.usage; cpu.stat usage_usec)
	NrPeriods   uint64 // CFS periods in which the group was runnable under a quota
	NrThrottled uint64 // of those, periods in which it was throttled
	ThrottledNs uint64 // time throttled (throttled_time; throttled_usec)
	// RunDelayNs is the ready-time analog (esxtop's %RDY): the time the
	// group's threads that exist now have spent runnable but waiting for a
	// CPU, summed from the second field of /proc/TID/schedstat. Threads
	// that exited take their share with them: Rates clamps a fall to 0.
	RunDelayNs uint64
	Threads    int // threads counted in RunDelayNs
	// PressureSomeUs is the group's PSI "some" total for cpu (cpu.pressure,
	// µs in which at least one of its tasks waited for a CPU); HasPressure
	// says the kernel has PSI for it.
	PressureSomeUs uint64
	HasPressure    bool
}

// Rates are a VM's CPU figures over one interval.
type Rates struct {
	UsedCores     float64 // CPU time used per wall time: 0.7 is 70% of one core
	ThrottledFrac float64 // throttled time per wall time (0 without a limit)
	NrThrottled   uint64  // periods throttled in the interval
	// ReadyPct is run-queue wait per wall time in percent, summed over the
	// group's threads as esxtop sums %RDY over a VM's vCPUs.
	ReadyPct float64
	// PressurePct is PSI "some" per wall time in percent; 0 when the
	// kernel has no PSI for the group (HasPressure false).
	PressurePct float64
	HasPressure bool
}

// Rates computes the figures between two samples elapsedNs apart.
func (s Stats) Rates(prev Stats, elapsedNs int64) Rates {
	if elapsedNs <= 0 {
		return Rates{}
	}
	d := func(a, b uint64) float64 {
		if a < b {
			return 0
		}
		return float64(a - b)
	}
	e := float64(elapsedNs)
	r := Rates{
		UsedCores:     d(s.UsageNs, prev.UsageNs) / e,
		ThrottledFrac: d(s.ThrottledNs, prev.ThrottledNs) / e,
		NrThrottled:   uint64(d(s.NrThrottled, prev.NrThrottled)),
		ReadyPct:      100 * d(s.RunDelayNs, prev.RunDelayNs) / e,
		HasPressure:   s.HasPressure && prev.HasPressure,
	}
	if r.HasPressure {
		r.PressurePct = 100 * d(s.PressureSomeUs, prev.PressureSomeUs) * 1000 / e
	}
	return r
}

// readPressure reads the "some" total of a PSI file; false when the file
// is missing or PSI is off (reading then fails with EOPNOTSUPP).
func readPressure(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// runTime sums the CPU time (ns, the first field of schedstat) of the
// threads tids; a thread that is gone counts 0.
func runTime(proc string, tids []int) uint64 { return schedstatSum(proc, tids, 0) }

// runDelay sums the run-queue wait (ns, the second field of schedstat) of
// the threads tids; a thread that is gone counts 0.
func runDelay(proc string, tids []int) uint64 { return schedstatSum(proc, tids, 1) }

// schedstatSum sums field (0-based) of /proc/TID/schedstat over tids.
func schedstatSum(proc string, tids []int, field int) uint64 {
	var sum uint64
	for _, t := range tids {
		b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(t), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) <= field {
			continue
		}
		if v, err := strconv.ParseUint(f[field], 10, 64); err == nil {
			sum += v
		}
	}
	return sum
}

// Detect finds the cgroup hierarchy of this machine from mountinfo (pass
// "" for /proc/self/mountinfo): V2 when the unified hierarchy has the cpu
// controller, else V1 when a legacy hierarchy has it (with cpuacct and the
// unified hierarchy, for PSI, where mounted).
func Detect(mountinfo string) (Tree, error) {
	if mountinfo == "" {
		mountinfo = "/proc/self/mountinfo"
	}
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("cpuctl: %w", err)
	}
	defer f.Close()
	var unified, cpu, acct string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		mnt := pf[4]
		switch qf[0] {
		case "cgroup2":
			if unified == "" {
				unified = mnt
			}
		case "cgroup":
			for _, o := range strings.Split(qf[2], ",") {
				switch o {
				case "cpu":
					cpu = mnt
				case "cpuacct":
					acct = mnt
				}
			}
		}
	}
	if unified != "" {
		if c, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers")); err == nil && hasWord(string(c), "cpu") {
			return V2{Root: unified}, nil
		}
	}
	if cpu != "" {
		return V1{CPU: cpu, Acct: acct, Unified: unified}, nil
	}
	return nil, fmt.Errorf("cpuctl: no cgroup hierarchy with the cpu controller in %s", mountinfo)
}
