package mclock

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"sluice/internal/cputime"
)

// BenchmarkAddPull measures one Add plus one Pull in steady state: n
// backlogged clients (depth requests queued each: 4, or 1 where every Pull
// empties the client's queue and every Add re-activates it), a third with reservations
// (together 30% of the device), a quarter with limits, shares 100–4000,
// 4 KiB to 256 KiB requests, and a device of 1M units/s (the clock advances
// by each request's service time). Every iteration adds a request for the
// client just served, so queues stay at the same depth.
func BenchmarkAddPull(b *testing.B) {
	for _, depth := range []int{4, 1} {
		for _, n := range []int{10, 100, 1000, 10000} {
			benchAddPull(b, n, depth)
		}
	}
}

func benchAddPull(b *testing.B, n, depth int) {
	b.Run(fmt.Sprintf("depth=%d/clients=%d", depth, n), func(b *testing.B) {
		const capacity = 1e6
		rng := rand.New(rand.NewPCG(1, 2))
		s := New(Config{})
		sizes := []int64{4 << 10, 8 << 10, 64 << 10, 256 << 10}
		for i := range n {
			p := Params{Shares: float64(100 + rng.IntN(3901))}
			if i%3 == 0 {
				p.ReservationIOPS = 0.3 * capacity / float64((n+2)/3)
			}
			if i%4 == 1 {
				p.LimitIOPS = 4 * capacity / float64(n)
			}
			if err := s.AddClient(i, p); err != nil {
				b.Fatal(err)
			}
			for range depth {
				_ = s.Add(i, Request{Bytes: sizes[rng.IntN(4)]}, 0)
			}
		}
		var now int64
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cputime.ThreadNs()
		for i := 0; i < b.N; i++ {
			req, id, ok, next := s.Pull(now)
			if !ok {
				now = next
				req, id, ok, _ = s.Pull(now)
				if !ok {
					b.Fatal("nothing to pull")
				}
			}
			now += s.Cost(req.Bytes) * 1e9 / capacity
			_ = s.Add(id, Request{Bytes: sizes[i&3]}, now)
		}
		b.ReportMetric(float64(cputime.ThreadNs()-cpu0)/float64(b.N), "cpu-ns/op")
	})
}
