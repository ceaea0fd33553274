package hclock

import "math"

// now turns the caller's clock into the scheduler's: float64 ns since an
// epoch (the first time seen), never going backwards. Tags are float64, so
// they are kept small: once the clock is rebaseNs past the epoch, every
// time tag moves back by that much (and share tags by their parent's share
// clock); a float64 then resolves well under a nanosecond whatever the
// caller's clock origin (Unix time included) and however long it runs.
func (s *Scheduler) now(nowNs int64) float64 {
	// Before the first call epochNs is far in the past (New), so that the
	// slow path starts the clock without a test here.
	if d := nowNs - s.epochNs; d < rebaseNs && float64(d) >= s.lastNow {
		s.lastNow = float64(d)
		return s.lastNow
	}
	return s.nowSlow(nowNs)
}

// nowSlow is now the first time, and when the tags are due to be rebased.
func (s *Scheduler) nowSlow(nowNs int64) float64 {
	if !s.started {
		s.started = true
		s.epochNs = nowNs
	}
	if nowNs-s.epochNs >= rebaseNs {
		s.rebase(rebaseNs)
	}
	t := float64(nowNs - s.epochNs)
	if t < s.lastNow {
		t = s.lastNow
	}
	s.lastNow = t
	return t
}

// rebaseNs is how far the clock may run from the epoch before tags are
// rebased (about 18 minutes). A variable so that a test can make it small.
var rebaseNs int64 = 1 << 40

// rebase moves the epoch forward by shiftNs and every tag with it. O(n),
// once per rebaseNs of clock; it allocates nothing.
func (s *Scheduler) rebase(shiftNs int64) {
	d := float64(shiftNs)
	s.epochNs += shiftNs
	s.lastNow -= d
	for i := range s.nodes {
		x := &s.nodes[i]
		x.rTag -= d
		x.lTag -= d
		x.eligibleAt -= d
		if in := x.in; in != nil {
			for j := range in.rh.e {
				in.rh.e[j].key -= d
			}
			for j := range in.lh.e {
				in.lh.e[j].key -= d
			}
			for j := range in.sh.e {
				in.sh.e[j].key -= in.vt
			}
			for _, c := range s.kids[i] {
				s.nodes[c].sTag -= in.vt
			}
			in.vt = 0
		}
	}
}

// Enqueue queues a packet of the given size at a port. It returns false,
// counting a drop, when the port's queue is full (backpressure), and false
// without counting when port is not a port ID or bytes is not in
// 1..MaxPacketBytes.
func (s *Scheduler) Enqueue(port int, bytes int, nowNs int64) bool {
	if port < 0 || port >= len(s.nodes) || !s.nodes[port].isPort || bytes <= 0 || bytes > MaxPacketBytes {
		return false
	}
	x := &s.nodes[port]
	if x.qN == x.qCap || (x.qBytesCap > 0 && x.qBytes+int64(bytes) > int64(x.qBytesCap)) {
		for id := int32(port); id >= 0; id = s.nodes[id].parent {
			cd := &s.cold[id]
			cd.droppedPackets++
			cd.droppedBytes += uint64(bytes)
		}
		return false
	}
	i := x.qHead + x.qN
	if i >= x.qCap {
		i -= x.qCap
	}
	s.slab[x.qOff+i] = int32(bytes)
	if x.qN == 0 {
		x.hBytes = int32(bytes)
	}
	x.qN++
	x.qBytes += int64(bytes)
	s.queued++
	if x.qN == 1 {
		now := s.now(nowNs)
		s.activate(int32(port), now)
	}
	return true
}

// activate makes an idle node active (something got queued below it) and
// updates its ancestors.
func (s *Scheduler) activate(id int32, now float64) {
	for {
		x := &s.nodes[id]
		if x.parent < 0 {
			x.eligibleAt = s.eligibleAt(x)
			return
		}
		p := &s.nodes[x.parent]
		s.place(id, now)
		p.in.nActive++
		if p.in.nActive > 1 {
			s.refreshUp(x.parent, now)
			return
		}
		id = x.parent
	}
}

// refreshUp recomputes eligibility of id and its ancestors after a change
// below them.
func (s *Scheduler) refreshUp(id int32, now float64) {
	for {
		x := &s.nodes[id]
		if x.parent < 0 {
			x.eligibleAt = s.eligibleAt(x)
			return
		}
		s.place(id, now)
		id = x.parent
	}
}

// eligibleAt is the earliest time at which something below x may be sent:
// its own limit tag, and for an inner node the earliest of its children.
func (s *Scheduler) eligibleAt(x *node) float64 {
	e := x.lTag
	if !x.isPort {
		switch {
		case x.in.sh.len() > 0:
			// Some child is eligible already.
		case x.in.lh.len() > 0:
			e = math.Max(e, x.in.lh.top().key)
		default:
			return math.Inf(1)
		}
	}
	return e
}

// place puts an active node id at the right spot in its parent's heaps:
// eligible (R and S heaps) or limited (L heap). A node entering the
// eligible set gets no credit for the time it was idle or ineligible.
func (s *Scheduler) place(id int32, now float64) {
	x := &s.nodes[id]
	p := &s.nodes[x.parent]
	e := s.eligibleAt(x)
	x.eligibleAt = e
	if e <= now {
		if x.state == stEligible {
			switch {
			case x.rNsPerByte > 0 && p.in.rh.has(id):
				p.in.rh.fix(id, x.rTag)
			case x.rNsPerByte > 0:
				// A reservation was just given (SetParams).
				x.rTag = math.Max(x.rTag, rFloor(p.in, now))
				p.in.rh.push(id, x.rTag)
			default:
				p.in.rh.remove(id)
			}
			p.in.sh.fix(id, x.sTag)
			return
		}
		if x.state == stLimited {
			// Back from being held by a limit: keep at most
			// MaxCreditBytes of what it was owed meanwhile.
			p.in.lh.remove(id)
			x.rTag = math.Max(x.rTag, rFloor(p.in, now)-s.creditBytes*x.rNsPerByte)
			x.sTag = math.Max(x.sTag, p.in.vt-s.creditBytes*x.sPerByte)
		} else {
			// Back from idle: no credit at all.
			x.rTag = math.Max(x.rTag, rFloor(p.in, now))
			x.sTag = math.Max(x.sTag, p.in.vt)
		}
		x.state = stEligible
		if x.rNsPerByte > 0 {
			p.in.rh.push(id, x.rTag)
		}
		p.in.sh.push(id, x.sTag)
		return
	}
	switch x.state {
	case stLimited:
		p.in.lh.fix(id, e)
		return
	case stIdle:
		// Busy again but held by a limit: still no credit for the idle
		// time; what it misses from now on is bounded when it gets out.
		x.rTag = math.Max(x.rTag, rFloor(p.in, now))
		x.sTag = math.Max(x.sTag, p.in.vt)
	case stEligible:
		p.in.rh.remove(id)
		p.in.sh.remove(id)
	}
	x.state = stLimited
	p.in.lh.push(id, e)
}

// deactivate takes an idle node out of its parent's heaps.
func (s *Scheduler) deactivate(id int32) {
	x := &s.nodes[id]
	p := &s.nodes[x.parent]
	switch x.state {
	case stEligible:
		p.in.rh.remove(id)
		p.in.sh.remove(id)
	case stLimited:
		p.in.lh.remove(id)
	}
	x.state = stIdle
	p.in.nActive--
}

// Dequeue picks the next packet to send at nowNs. When nothing may be sent
// it returns ok false and nextEligibleNs: the time at which something will
// be (limits), or Never when nothing is queued. The caller calls Dequeue
// when the wire is free, and again at nextEligibleNs or at the next Enqueue.
func (s *Scheduler) Dequeue(nowNs int64) (pkt Packet, ok bool, nextEligibleNs int64) {
	now := float64(nowNs - s.epochNs) // s.now written out: it is not inlined
	if nowNs-s.epochNs >= rebaseNs || now < s.lastNow {
		now = s.nowSlow(nowNs)
	}
	s.lastNow = now
	nodes := s.nodes
	r := &nodes[s.root]
	if r.in.nActive == 0 {
		return Packet{}, false, Never
	}
	if r.eligibleAt > now {
		return Packet{}, false, int64(math.Ceil(r.eligibleAt)) + s.epochNs
	}
	// Walk down: at each level take a child behind its reservation, else
	// the eligible child with the smallest share tag.
	path := s.path
	depth := 0
	x := r
	var leaf step
	for in := r.in; in != nil; in = x.in {
		if len(in.lh.e) > 0 && in.lh.e[0].key <= now {
			s.release(in, now)
		}
		st := step{in: in, phase: ByShares}
		if len(in.rh.e) > 0 {
			t := in.rh.e[0]
			if due := t.key + in.rOff; due <= now {
				st.id, st.phase = t.id, ByReservation
				if lag := now - due; lag > float64(s.cfg.MaxReservationLagNs) {
					in.rOff += lag - float64(s.cfg.MaxReservationLagNs)
				}
			}
		}
		if st.phase == ByShares {
			if len(in.sh.e) == 0 {
				// Cannot happen while the invariants hold; be safe.
				return Packet{}, false, Never
			}
			// The S heap's key is the child's sTag: read it there, not
			// from the child's node (one dependent load fewer).
			t := in.sh.e[0]
			st.id = t.id
			if t.key > in.vt {
				in.vt = t.key
			}
		}
		path[depth] = st
		depth++
		leaf = st
		x = &nodes[st.id]
	}
	// Pop the packet. The head's size is cached in the node, so that
	// charging does not wait for the queue slot to come from memory.
	size := x.hBytes
	x.qHead++
	if x.qHead == x.qCap {
		x.qHead = 0
	}
	x.qN--
	if x.qN > 0 {
		x.hBytes = s.slab[x.qOff+x.qHead]
	}
	x.qBytes -= int64(size)
	s.queued--
	b := float64(size)
	// Charge the path bottom-up and re-place each node in its parent.
	for i := depth - 1; i >= 0; i-- {
		st := &path[i]
		y := &nodes[st.id]
		charge(y, b, size, now)
		if st.phase == ByReservation {
			y.rTag += b * y.rNsPerByte
			s.cold[st.id].resvBytes += uint64(size)
		} else {
			y.sTag += b * y.sPerByte
		}
		if y.in == nil {
			if y.qN == 0 {
				s.deactivate(st.id)
				continue
			}
		} else if y.in.nActive == 0 {
			s.deactivate(st.id)
			continue
		}
		if y.state == stEligible && y.lTag <= now && (y.in == nil || len(y.in.sh.e) > 0) {
			// Still eligible: only the tag it was chosen by moved, and it
			// is still the top of the heap it was chosen from.
			y.eligibleAt = y.lTag
			if st.phase == ByReservation {
				st.in.rh.raiseTop(y.rTag)
			} else {
				st.in.sh.raiseTop(y.sTag)
			}
			continue
		}
		s.place(st.id, now)
	}
	charge(r, b, size, now)
	if r.in.sh.len() > 0 {
		r.eligibleAt = r.lTag // s.eligibleAt(r), the usual case
	} else {
		r.eligibleAt = s.eligibleAt(r)
	}
	return Packet{Port: int(leaf.id), Bytes: int(size), Phase: leaf.phase}, true, nowNs
}

// step is one level of the path Dequeue walks: the child chosen, how, and
// its parent's heaps.
type step struct {
	in    *inner
	id    int32
	phase Phase
}

// release moves the children of in whose limit has let go of them by now
// from the L heap into the eligible set.
func (s *Scheduler) release(in *inner, now float64) {
	for len(in.lh.e) > 0 && in.lh.e[0].key <= now {
		s.place(in.lh.e[0].id, now)
	}
}

// charge advances a node's limit tag and counters for one packet.
func charge(y *node, b float64, bytes int32, now float64) {
	if y.lNsPerByte > 0 {
		l := y.lTag
		if floor := now - y.lSlackNs; floor > l {
			l = floor
		}
		y.lTag = l + b*y.lNsPerByte
	}
	y.sentBytes += uint64(bytes)
	y.sentPackets++
}

// rFloor is the reservation tag a child of p starts from when it becomes
// eligible: now, or the tag of the child most behind its reservation if
// that is earlier (in a shortage all are behind; a newcomer must queue
// with them, not behind them). It is the reservation analogue of vt.
func rFloor(p *inner, now float64) float64 {
	f := now - p.rOff
	if p.rh.len() > 0 {
		if t := p.rh.top().key; t < f {
			f = t
		}
	}
	return f
}
