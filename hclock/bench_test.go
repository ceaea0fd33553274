package hclock

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"sluice/internal/cputime"
)

// benchTree is an uplink with the nine NetIOC traffic classes; all ports
// but eight sit in the vm class (the worst case for the heaps: one class
// holding ports-8 children). A tenth of the ports have a reservation, a
// tenth a limit; shares are random.
func benchTree(ports int) Config {
	rng := rand.New(rand.NewPCG(uint64(ports), 1))
	cfg := Config{}
	add := func(parent int, p Params) int {
		id := len(cfg.Nodes)
		cfg.Nodes = append(cfg.Nodes, NodeConfig{ID: id, Parent: parent, Name: fmt.Sprint(id), Params: p, QueuePackets: 8})
		return id
	}
	root := add(-1, Params{})
	vm := add(root, Params{ReservationBps: 4e9, Shares: 100})
	var classes []int
	for range 8 {
		classes = append(classes, add(root, Params{Shares: 50}))
	}
	for i := range ports {
		parent := vm
		if i < 8 && ports > 8 {
			parent = classes[i]
		}
		p := Params{Shares: float64(1 + rng.IntN(100))}
		switch i % 10 {
		case 3:
			p.ReservationBps = 4e9 / float64(ports)
		case 7:
			p.LimitBps = 2e9
		}
		add(parent, p)
	}
	return cfg
}

// BenchmarkEnqueueDequeue measures one Dequeue plus one Enqueue (the
// packet's port is refilled) per op, in steady state with every port
// backlogged, on a 10 Gbps link with 1500-byte packets.
func BenchmarkEnqueueDequeue(b *testing.B) {
	for _, ports := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("ports=%d", ports), func(b *testing.B) {
			cfg := benchTree(ports)
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			var now int64
			for id := range cfg.Nodes {
				if s.IsPort(id) {
					for range 4 {
						s.Enqueue(id, 1500, now)
					}
				}
			}
			const wireNs = 1200 // 1500 bytes at 10 Gbps
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cputime.ProcessNs()
			for range b.N {
				p, ok, next := s.Dequeue(now)
				if !ok {
					now = next
					continue
				}
				s.Enqueue(p.Port, p.Bytes, now)
				now += wireNs
			}
			b.ReportMetric(float64(cputime.ProcessNs()-c0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkOnePort is the floor: the same loop on a tree of one class with
// one port (no competition, no heaps to speak of). On a shared machine,
// compare the other results with it rather than with absolute targets.
func BenchmarkOnePort(b *testing.B) {
	cfg := Config{Nodes: []NodeConfig{
		{ID: 0, Parent: -1},
		{ID: 1, Parent: 0, Params: Params{Shares: 1}},
		{ID: 2, Parent: 1, Params: Params{Shares: 1}, QueuePackets: 8},
	}}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for range 4 {
		s.Enqueue(2, 1500, 0)
	}
	var now int64
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cputime.ProcessNs()
	for range b.N {
		p, _, _ := s.Dequeue(now)
		s.Enqueue(p.Port, p.Bytes, now)
		now += 1200
	}
	b.ReportMetric(float64(cputime.ProcessNs()-c0)/float64(b.N), "cpu-ns/op")
}
