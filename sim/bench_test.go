package sim

import (
	"testing"
	"time"

	"sluice/internal/cputime"
)

// benchScenario runs one run of a seed scenario for durS simulated
// seconds per iteration and reports simulated events per second of wall
// and of CPU time (the machine is shared: CPU time is the fairer figure).
func benchScenario(b *testing.B, file, run string, durS int64) {
	sc, err := LoadScenario(file)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range sc.Runs {
		if r.Name == run {
			sc.Runs = []RunSpec{r}
		}
	}
	if len(sc.Runs) != 1 {
		b.Fatalf("no run %q", run)
	}
	sc.Expect, sc.durNs = nil, durS*Second
	var events uint64
	cpu0, wall0 := time.Duration(cputime.ProcessNs()), time.Now()
	for b.Loop() {
		res, err := Run(sc)
		if err != nil {
			b.Fatal(err)
		}
		events += res.Runs[0].Events
	}
	cpu, wall := time.Duration(cputime.ProcessNs())-cpu0, time.Since(wall0)
	b.ReportMetric(float64(events)/wall.Seconds(), "events/s")
	b.ReportMetric(float64(events)/cpu.Seconds(), "events/cpu-s")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}

// Exp. 1: 12 VMs × 4 streams, NFS and vMotion, 10 GbE, 150 s simulated
// (target ≤ 10 s per run).
func BenchmarkExp1(b *testing.B) {
	benchScenario(b, "../scenarios/seeds/netioc-exp1.yaml", "main", 150)
}

// Exp. 3 at 100 VMs under NetIOC, 60 s simulated (target ≤ 60 s per run).
func BenchmarkExp3VMs100(b *testing.B) {
	benchScenario(b, "../scenarios/seeds/netioc-exp3.yaml", "n100", 60)
}

// SIOC Test 3: 4 OLTP VMs on 2 hosts, 900 s simulated.
func BenchmarkSIOCTest3(b *testing.B) {
	benchScenario(b, "../scenarios/seeds/sioc-test3.yaml", "main", 900)
}
