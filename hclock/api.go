package hclock

import (
	"fmt"
	"math"
)

// Stats returns the counters of node id (zero for an unknown id).
// QueuedBytes and QueuedPackets are filled for ports only.
func (s *Scheduler) Stats(id int) NodeStats {
	if id < 0 || id >= len(s.nodes) {
		return NodeStats{}
	}
	x := &s.nodes[id]
	cd := &s.cold[id]
	st := NodeStats{
		SentBytes: x.sentBytes, SentPackets: x.sentPackets, ReservationBytes: cd.resvBytes,
		DroppedBytes: cd.droppedBytes, DroppedPackets: cd.droppedPackets,
	}
	if x.isPort {
		st.QueuedBytes, st.QueuedPackets = uint64(x.qBytes), uint64(x.qN)
	}
	return st
}

// Len is the number of packets queued at all ports.
func (s *Scheduler) Len() int { return s.queued }

// NumNodes is the number of nodes in the tree (IDs are 0..NumNodes()-1).
func (s *Scheduler) NumNodes() int { return len(s.nodes) }

// IsPort reports whether id is a port (a leaf with a queue).
func (s *Scheduler) IsPort(id int) bool {
	return id >= 0 && id < len(s.nodes) && s.nodes[id].isPort
}

// Name is the name node id was configured with.
func (s *Scheduler) Name(id int) string {
	if id < 0 || id >= len(s.nodes) {
		return ""
	}
	return s.cold[id].name
}

// Params returns node id's current reservation, shares and limit.
func (s *Scheduler) Params(id int) Params {
	if id < 0 || id >= len(s.nodes) {
		return Params{}
	}
	return s.cold[id].params
}

// SetParams changes node id's reservation, shares and limit at nowNs. Queued
// packets stay; the new values govern from now on (a limit tag in the
// future is rescaled to the new limit, so raising a limit takes effect at
// once). It allocates nothing.
func (s *Scheduler) SetParams(id int, p Params, nowNs int64) error {
	if id < 0 || id >= len(s.nodes) {
		return fmt.Errorf("hclock: no node %d", id)
	}
	x := &s.nodes[id]
	if err := checkParams(s.cold[id].name, p, x.parent < 0); err != nil {
		return err
	}
	now := s.now(nowNs)
	oldL := x.lNsPerByte
	s.cold[id].params = p
	// The most a subtree can take changes along the path to the root.
	for y := int32(id); y >= 0; y = s.nodes[y].parent {
		n := &s.nodes[y]
		cd := &s.cold[y]
		l := math.Inf(1)
		if !unlimited(cd.params.LimitBps) {
			l = cd.params.LimitBps
		}
		if !n.isPort {
			sum := 0.0
			for _, c := range s.kids[y] {
				sum += s.cold[c].lEff
			}
			l = math.Min(l, sum)
		}
		cd.lEff = l
		s.derive(y)
	}
	if oldL > 0 && x.lTag > now {
		x.lTag = now + (x.lTag-now)*x.lNsPerByte/oldL
	}
	if x.parent < 0 {
		x.eligibleAt = s.eligibleAt(x)
	} else if x.state != stIdle {
		s.refreshUp(int32(id), now)
	}
	return nil
}
