package livelab

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MachineSample is what the kernel counts of the whole machine at one
// moment: CPU time by kind (/proc/stat, USER_HZ ticks), the time in which
// some task waited for a CPU (/proc/pressure/cpu "some", µs) and the
// runnable tasks (/proc/loadavg). A test that sets measurements aside
// because the machine starved it shows these, taken over the same seconds:
// evidence, not a guess.
type MachineSample struct {
	At                      time.Time
	Busy, Nice, Idle, Steal uint64 // ticks; Busy includes Nice
	WaitUs                  uint64 // PSI cpu some total
	HasPSI                  bool
	Runnable                int
}

// userHz is the kernel's USER_HZ, the unit of /proc/stat.
const userHz = 100

// SampleMachine reads the machine's counters now (zero fields where the
// kernel does not have them).
func SampleMachine() MachineSample {
	s := MachineSample{At: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) >= 9 && f[0] == "cpu" {
			var v [8]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
			}
			// user nice system idle iowait irq softirq steal
			s.Busy = v[0] + v[1] + v[2] + v[5] + v[6]
			s.Nice, s.Idle, s.Steal = v[1], v[3]+v[4], v[7]
		}
	}
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		for _, kv := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				s.WaitUs, _ = strconv.ParseUint(v, 10, 64)
				s.HasPSI = true
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 4 {
			run, _, _ := strings.Cut(f[3], "/")
			s.Runnable, _ = strconv.Atoi(run)
		}
	}
	return s
}

// Load is what the machine did between two samples.
type Load struct {
	Seconds    float64
	CPUs       int
	BusyCores  float64 // CPU time used, in cores (nice included)
	NiceCores  float64 // of which by niced tasks
	StealCores float64 // taken by the hypervisor
	// WaitShare is the share of the time in which at least one runnable
	// task waited for a CPU (PSI some); -1 without PSI.
	WaitShare float64
	Runnable  int // runnable tasks at the end (this test's included)
}

// Since is the machine's load from a to s.
func (s MachineSample) Since(a MachineSample) Load {
	el := s.At.Sub(a.At).Seconds()
	l := Load{Seconds: el, CPUs: runtime.NumCPU(), WaitShare: -1, Runnable: s.Runnable}
	if el <= 0 {
		return l
	}
	ticks := el * userHz
	l.BusyCores = float64(s.Busy-a.Busy) / ticks
	l.NiceCores = float64(s.Nice-a.Nice) / ticks
	l.StealCores = float64(s.Steal-a.Steal) / ticks
	if s.HasPSI && a.HasPSI {
		l.WaitShare = float64(s.WaitUs-a.WaitUs) / 1e6 / el
	}
	return l
}

func (l Load) String() string {
	w := "no PSI"
	if l.WaitShare >= 0 {
		w = fmt.Sprintf("some task waited for a CPU %.0f%% of the time", 100*l.WaitShare)
	}
	return fmt.Sprintf("machine over %.1f s: CPUs busy %.2f of %d cores (niced %.2f), stolen by the hypervisor %.2f, %s, %d runnable",
		l.Seconds, l.BusyCores, l.CPUs, l.NiceCores, l.StealCores, w, l.Runnable)
}

// MachineWatch samples the machine once a second until stopped, so that a
// test can say what the machine did in any of its seconds.
type MachineWatch struct {
	mu      sync.Mutex
	samples []MachineSample
	quit    chan struct{}
	done    chan struct{}
}

// WatchMachine starts a MachineWatch; cleanup stops it.
func WatchMachine(t interface{ Cleanup(func()) }) *MachineWatch {
	w := &MachineWatch{samples: []MachineSample{SampleMachine()}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
				s := SampleMachine()
				w.mu.Lock()
				w.samples = append(w.samples, s)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return w
}

// Stop ends the watch (idempotent).
func (w *MachineWatch) Stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// Between is the machine's load over the samples that cover [a, b] (from
// the last sample at or before a to the first at or after b; a fresh
// sample when b is later than the last).
func (w *MachineWatch) Between(a, b time.Time) Load {
	w.mu.Lock()
	s := append([]MachineSample(nil), w.samples...)
	w.mu.Unlock()
	if last := s[len(s)-1]; last.At.Before(b) {
		s = append(s, SampleMachine())
	}
	i := sort.Search(len(s), func(i int) bool { return s[i].At.After(a) }) - 1
	j := sort.Search(len(s), func(i int) bool { return !s[i].At.Before(b) })
	i, j = max(i, 0), min(j, len(s)-1)
	if j <= i {
		j = min(i+1, len(s)-1)
	}
	return s[j].Since(s[i])
}
