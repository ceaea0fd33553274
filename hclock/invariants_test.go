package hclock

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// check verifies the scheduler's internal invariants: heap order and
// index consistency, each active node in exactly the heaps its state says,
// activity counts, and queue totals. It returns the first violation.
func (s *Scheduler) check() error {
	queued := 0
	for id := range s.nodes {
		x := &s.nodes[id]
		if x.isPort {
			queued += int(x.qN)
		} else {
			in := x.in
			for _, h := range []*iheap{&in.rh, &in.sh, &in.lh} {
				for i, e := range h.e {
					if h.pos[e.id] != int32(i) {
						return fmt.Errorf("node %d: heap pos of %d is %d, want %d", id, e.id, h.pos[e.id], i)
					}
					if i > 0 && e.key < h.e[(i-1)/4].key {
						return fmt.Errorf("node %d: heap order broken at %d", id, i)
					}
					if s.nodes[e.id].parent != int32(id) {
						return fmt.Errorf("node %d: heap holds %d, not its child", id, e.id)
					}
				}
			}
			n := int32(0)
			for _, c := range s.kids[id] {
				if s.nodes[c].state != stIdle {
					n++
				}
			}
			if n != in.nActive {
				return fmt.Errorf("node %d: nActive %d, %d children active", id, in.nActive, n)
			}
		}
		if x.parent < 0 {
			continue
		}
		active := (x.isPort && x.qN > 0) || (!x.isPort && x.in.nActive > 0)
		p := s.nodes[x.parent].in
		inR, inS, inL := p.rh.has(int32(id)), p.sh.has(int32(id)), p.lh.has(int32(id))
		switch x.state {
		case stIdle:
			if active || inR || inS || inL {
				return fmt.Errorf("node %d: idle but active=%v inR=%v inS=%v inL=%v", id, active, inR, inS, inL)
			}
		case stEligible:
			if !active || !inS || inL || inR != (x.rNsPerByte > 0) {
				return fmt.Errorf("node %d: eligible but active=%v inR=%v inS=%v inL=%v", id, active, inR, inS, inL)
			}
			if e := s.eligibleAt(x); e > s.lastNow {
				return fmt.Errorf("node %d: eligible but eligible only at %v (now %v)", id, e, s.lastNow)
			}
			if p.sh.e[p.sh.pos[id]].key != x.sTag || (inR && p.rh.e[p.rh.pos[id]].key != x.rTag) {
				return fmt.Errorf("node %d: stale heap key", id)
			}
		case stLimited:
			if !active || inR || inS || !inL {
				return fmt.Errorf("node %d: limited but active=%v inR=%v inS=%v inL=%v", id, active, inR, inS, inL)
			}
			if k, e := p.lh.e[p.lh.pos[id]].key, s.eligibleAt(x); k != e {
				return fmt.Errorf("node %d: limited with key %v, eligible at %v", id, k, e)
			}
		}
	}
	if queued != s.queued {
		return fmt.Errorf("queued %d, ports hold %d", s.queued, queued)
	}
	return nil
}

// sendable reports, from first principles, whether port id may send at
// now (something queued, no limit on the path holds it) and from when.
func (s *Scheduler) sendableAt(id int) float64 {
	x := &s.nodes[id]
	if x.qN == 0 {
		return math.Inf(1)
	}
	t := math.Inf(-1)
	for y := int32(id); y >= 0; y = s.nodes[y].parent {
		t = math.Max(t, s.nodes[y].lTag)
	}
	return t
}

// randomOps drives a random tree with random operations and checks after
// each: the internal invariants, that Dequeue sends exactly when some port
// may send, that what it sends may be sent, and that nextEligibleNs is the
// earliest time a port may send.
func randomOps(seed uint64, nOps int) error {
	rng := rand.New(rand.NewPCG(seed, 7))
	cfg := Config{LimitBurstBytes: 1 + rng.IntN(100000)}
	add := func(parent int) int {
		id := len(cfg.Nodes)
		p := Params{Shares: float64(1 + rng.IntN(100))}
		if rng.IntN(3) == 0 {
			p.ReservationBps = float64(1 + rng.IntN(5e9))
		}
		if rng.IntN(3) == 0 {
			p.LimitBps = float64(1e6 + rng.IntN(5e9))
		}
		cfg.Nodes = append(cfg.Nodes, NodeConfig{ID: id, Parent: parent, Name: fmt.Sprint(id), Params: p, QueuePackets: 1 + rng.IntN(8)})
		return id
	}
	root := add(-1)
	var ports []int
	for range 1 + rng.IntN(4) {
		c := add(root)
		for range 1 + rng.IntN(4) {
			if rng.IntN(4) == 0 {
				g := add(c)
				for range 1 + rng.IntN(3) {
					ports = append(ports, add(g))
				}
			} else {
				ports = append(ports, add(c))
			}
		}
	}
	s, err := New(cfg)
	if err != nil {
		return err
	}
	var now int64
	for op := range nOps {
		switch r := rng.IntN(20); {
		case r < 8:
			s.Enqueue(ports[rng.IntN(len(ports))], []int{64, 1500, 9000, 65536}[rng.IntN(4)], now)
		case r < 17:
			earliest := math.Inf(1)
			at := map[int]float64{}
			for _, p := range ports {
				at[p] = s.sendableAt(p)
				earliest = math.Min(earliest, at[p])
			}
			epoch0, started := s.epochNs, s.started
			pkt, ok, next := s.Dequeue(now)
			// Dequeue set lastNow to its view of now; tags computed before
			// are in the old frame if it set or moved the epoch.
			nowF := s.lastNow
			if shift := float64(s.epochNs - epoch0); started && shift != 0 {
				earliest -= shift
				for p := range at {
					at[p] -= shift
				}
			}
			if next != Never {
				next -= s.epochNs
			}
			switch {
			case ok && at[pkt.Port] <= nowF:
				// Fine: the port it sent from was allowed to send.
			case ok:
				return fmt.Errorf("op %d: sent from port %d, which may send only at %v (now %v)", op, pkt.Port, at[pkt.Port], nowF)
			case earliest <= nowF:
				return fmt.Errorf("op %d: sent nothing although a port may send since %v (now %v)", op, earliest, nowF)
			case math.IsInf(earliest, 1) && next != Never:
				return fmt.Errorf("op %d: nothing queued but nextEligibleNs %d", op, next)
			case !math.IsInf(earliest, 1) && (float64(next) < earliest || float64(next) > earliest+1):
				return fmt.Errorf("op %d: nextEligibleNs %d, a port may send at %v", op, next, earliest)
			}
		case r < 18:
			id := rng.IntN(len(cfg.Nodes))
			p := s.Params(id)
			switch rng.IntN(3) {
			case 0:
				p.ReservationBps = float64(rng.IntN(3e9))
			case 1:
				p.LimitBps = float64(rng.IntN(5e9))
			default:
				p.Shares = float64(1 + rng.IntN(100))
			}
			if err := s.SetParams(id, p, now); err != nil {
				return err
			}
		default:
			now += int64(rng.IntN(200_000))
		}
		now += int64(rng.IntN(2000))
		if err := s.check(); err != nil {
			return fmt.Errorf("op %d: %v", op, err)
		}
	}
	return nil
}

// TestRandomOps runs randomOps on many random trees.
func TestRandomOps(t *testing.T) {
	defer func(old int64) { rebaseNs = old }(rebaseNs)
	for seed := range uint64(300) {
		// Every third tree also crosses many rebases of the clock.
		rebaseNs = 1 << 40
		if seed%3 == 0 {
			rebaseNs = 1 << 20
		}
		if err := randomOps(seed, 3000); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

// FuzzOps explores more trees and operation sequences:
// `go test ./hclock -run XXX -fuzz FuzzOps -fuzztime 1m`.
func FuzzOps(f *testing.F) {
	f.Add(uint64(1))
	f.Add(uint64(12345))
	f.Fuzz(func(t *testing.T, seed uint64) {
		if err := randomOps(seed, 2000); err != nil {
			t.Fatal(err)
		}
	})
}

// TestClockOrigin runs seed Fig. 2 (b) with a Unix-time clock (1.7e18 ns)
// and the tags rebased every 16 ms: the split must still be
// 8.13/0.63/0.63 Gbps within 1%. Without the epoch a float64 would resolve
// that clock only to 256 ns, a fifth of a 1500-byte packet at 9.4 Gbps.
func TestClockOrigin(t *testing.T) {
	defer func(old int64) { rebaseNs = old }(rebaseNs)
	rebaseNs = 1 << 24
	tr, err := parseTree(`
up
vm parent=up r=7.5Gbps s=100
vm1 parent=vm r=7.5Gbps s=50
vm2 parent=vm s=50
vm3 parent=vm s=50`)
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLinkSim(tr, 9.4e9, 1)
	if err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_700_000_000_000_000_000)
	l.nowNs = t0
	for _, name := range []string{"vm1", "vm2", "vm3"} {
		l.add(&source{port: tr.idx[name], greedy: true, size: 1500, startNs: t0})
	}
	warm, end := t0+50_000_000, t0+400_000_000
	for l.nowNs < warm && l.step(warm) {
	}
	s0, _, w0, _ := l.snapshot()
	for l.nowNs < end && l.step(end) {
	}
	s1, _, w1, _ := l.snapshot()
	for name, want := range map[string]float64{"vm1": 7.5e9 + 1.9e9/3, "vm2": 1.9e9 / 3, "vm3": 1.9e9 / 3} {
		i := tr.idx[name]
		got := (s1[i] - s0[i]) * 8 / (float64(w1-w0) / 1e9)
		if math.Abs(got-want) > 0.01*want {
			t.Errorf("%s got %.4g bps, want %.4g ± 1%%", name, got, want)
		}
	}
}
