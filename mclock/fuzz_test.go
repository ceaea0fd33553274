package mclock

import (
	"fmt"
	"math"
	"testing"
)

// FuzzScheduler drives a Scheduler with an arbitrary sequence of Add, Pull,
// Update, RemoveClient and AddClient calls (time only moves forward) and
// checks after every call:
//   - Pull serves a queued request of a known client, in FIFO order per
//     client, and never a request over the limit under Wait;
//   - when Pull serves nothing but requests are queued: under Wait,
//     nextEligibleNs lies in (now, Never) and a Pull at nextEligibleNs
//     serves; under AllowWhenIdle, that cannot happen;
//   - Len equals the sum of the clients' queues; the phase counters add
//     up to the served cost.
func FuzzScheduler(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 5, 5, 5, 1, 1, 1, 1, 2, 9, 9, 3, 3, 3, 3, 4, 4, 7, 7, 8})
	f.Add([]byte{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200})
	f.Add([]byte{255, 1, 254, 2, 253, 3, 252, 4, 251, 5, 250, 6, 249, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		cfg := Config{AtLimit: AtLimit(data[0] & 1)}
		s := New(cfg)
		const nc = 4
		present := [nc]bool{}
		params := func(b byte) Params {
			p := Params{Shares: float64(1 + int(b)%7*100)}
			if b&8 != 0 {
				p.ReservationIOPS = float64(50 * (1 + int(b>>4)%4))
			}
			if b&16 != 0 {
				p.LimitIOPS = math.Max(p.ReservationIOPS, 100*float64(1+int(b>>5)%3))
			}
			return p
		}
		for i := range nc {
			if err := s.AddClient(i, params(byte(i*37))); err != nil {
				t.Fatal(err)
			}
			present[i] = true
		}
		var now int64
		var handle uint64
		last := map[int]uint64{}
		queued := [nc]int{}
		pull := func() (bool, int64) {
			req, id, ok, next := s.Pull(now)
			if !ok {
				return false, next
			}
			if id < 0 || id >= nc || !present[id] || queued[id] == 0 {
				t.Fatalf("served client %d that has nothing queued", id)
			}
			if req.Handle <= last[id] {
				t.Fatalf("client %d: handle %d after %d: not FIFO", id, req.Handle, last[id])
			}
			if cfg.AtLimit == Wait && s.LastPhase() == OverLimit {
				t.Fatal("served over the limit under Wait")
			}
			last[id] = req.Handle
			queued[id]--
			return true, now
		}
		for i := 1; i+1 < len(data); i += 2 {
			op, arg := data[i]%6, data[i+1]
			id := int(arg) % nc
			switch op {
			case 0, 1: // add
				if !present[id] {
					continue
				}
				handle++
				if err := s.Add(id, Request{Bytes: int64(arg) << 11, Handle: handle}, now); err != nil {
					t.Fatal(err)
				}
				queued[id]++
			case 2, 3: // pull, then move time
				ok, next := pull()
				if !ok && s.Len() > 0 {
					if cfg.AtLimit == AllowWhenIdle {
						t.Fatal("AllowWhenIdle left the device idle with requests queued")
					}
					if next <= now || next == Never {
						t.Fatalf("nothing served at %d with %d queued, next %d", now, s.Len(), next)
					}
					now = next
					if ok, _ := pull(); !ok {
						t.Fatalf("nothing served at nextEligibleNs %d", now)
					}
				}
				now += int64(arg) * 100_000
			case 4: // update
				if present[id] {
					if err := s.Update(id, params(arg)); err != nil {
						t.Fatal(err)
					}
				}
			case 5: // remove or re-add
				if present[id] {
					n, err := s.RemoveClient(id)
					if err != nil || n != queued[id] {
						t.Fatalf("remove %d: dropped %d of %d, %v", id, n, queued[id], err)
					}
					present[id], queued[id] = false, 0
				} else {
					if err := s.AddClient(id, params(arg)); err != nil {
						t.Fatal(err)
					}
					present[id] = true
				}
			}
			total := 0
			for c := range nc {
				total += queued[c]
				st, ok := s.Stats(c)
				if ok != present[c] {
					t.Fatalf("client %d: Stats ok=%v, present=%v", c, ok, present[c])
				}
				if !ok {
					continue
				}
				if st.Queued != queued[c] {
					t.Fatalf("client %d: %d queued, want %d", c, st.Queued, queued[c])
				}
				if st.ByReservation+st.ByWeight+st.OverLimit != st.ServedCost {
					t.Fatalf("client %d: phase counters do not add up: %+v", c, st)
				}
			}
			if s.Len() != total {
				t.Fatalf("Len %d, want %d", s.Len(), total)
			}
			if err := s.checkHeaps(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// checkHeaps checks the heaps' structure: positions match, every parent is
// no larger than its children, every entry is a known client keyed by its
// head tag, queued clients are in the R heap iff they have a reservation
// and in exactly one of P and L, and an unqueued client is in no heap
// unless it is the one Pull just emptied.
func (s *Scheduler) checkHeaps() error {
	for k := range s.heaps {
		h := &s.heaps[k]
		for i, e := range h.a {
			if h.pos[e.id] != int32(i) {
				return fmt.Errorf("heap %d: client %d at %d, pos says %d", k, e.id, i, h.pos[e.id])
			}
			if i > 0 && e.less(h.a[(i-1)/4]) {
				return fmt.Errorf("heap %d: entry %d smaller than its parent", k, i)
			}
			c := s.client(int(e.id))
			if c == nil {
				return fmt.Errorf("heap %d: unknown client %d", k, e.id)
			}
			if c.qLen == 0 && c != s.emptied {
				return fmt.Errorf("heap %d: client %d has nothing queued", k, e.id)
			}
			if e.key != c.tag[k] {
				return fmt.Errorf("heap %d: client %d keyed %d, tag %d", k, e.id, e.key, c.tag[k])
			}
		}
	}
	for _, c := range s.clients {
		if c == nil || c.qLen == 0 {
			continue
		}
		inR, inP, inL := s.heaps[kR].pos[c.id] >= 0, s.heaps[kP].pos[c.id] >= 0, s.heaps[kL].pos[c.id] >= 0
		if inR != (c.tag[kR] != Never) || inP == inL {
			return fmt.Errorf("client %d (%d queued): in R %v P %v L %v, R tag %d", c.id, c.qLen, inR, inP, inL, c.tag[kR])
		}
	}
	return nil
}

// TestRebaseP checks that shifting virtual time back changes no decision:
// two schedulers, one rebasing very often, serve the same random workload
// in the same order.
func TestRebaseP(t *testing.T) {
	a, b := New(Config{}), New(Config{})
	b.pRebaseAt = 1 << 32
	for i := range 8 {
		p := Params{Shares: float64(1 + i%3), ReservationIOPS: float64(100 * (i % 2)), LimitIOPS: float64(2000 * (i % 4 / 3))}
		_ = a.AddClient(i, p)
		_ = b.AddClient(i, p)
	}
	var now int64
	x := uint64(1)
	rebased := 0
	for n := range 200000 {
		x = x*6364136223846793005 + 1442695040888963407
		id := int(x>>33) % 8
		if x>>60 < 9 {
			r := Request{Bytes: int64(x>>40) % (256 << 10), Handle: uint64(n)}
			_ = a.Add(id, r, now)
			_ = b.Add(id, r, now)
		}
		before := b.vP
		ra, ia, oka, na := a.Pull(now)
		rb, ib, okb, nb := b.Pull(now)
		if b.vP < before {
			rebased++
		}
		if ra != rb || ia != ib || oka != okb || na != nb {
			t.Fatalf("step %d: a served %v c%d %v %d, b served %v c%d %v %d", n, ra, ia, oka, na, rb, ib, okb, nb)
		}
		now += int64(x>>50) * 100
	}
	if rebased == 0 {
		t.Fatal("b never rebased: the test does not test")
	}
	t.Logf("rebased %d times", rebased)
}

// TestCost pins the size → cost rule: ceil(bytes/chunk), at least 1.
func TestCost(t *testing.T) {
	for _, tc := range []struct {
		chunk, bytes, want int64
	}{
		{0, 0, 1}, {0, 4096, 1}, {0, 32 << 10, 1}, {0, 32<<10 + 1, 2}, {0, 64 << 10, 2},
		{0, 256 << 10, 8}, {0, 1 << 20, 32}, {0, math.MaxInt64, math.MaxInt64/(32<<10) + 1},
		{4096, 4096, 1}, {4096, 8192, 2}, {3000, 6001, 3}, {1, 7, 7},
	} {
		if got := New(Config{ChunkBytes: tc.chunk}).Cost(tc.bytes); got != tc.want {
			t.Errorf("chunk %d: Cost(%d) = %d, want %d", tc.chunk, tc.bytes, got, tc.want)
		}
	}
}
