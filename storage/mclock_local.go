package storage

// This file holds the gateway's per-request tag scheduler: mClock (Gulati et
// al., OSDI 2010) with reservation (R), limit (L) and proportional (P) tags
// per disk. It is pure: time is an argument in nanoseconds. It stands in for
// package mclock until that package's API is available to the gateway.

// mclockDisk is the scheduling state of one disk (one queue).
type mclockDisk struct {
	reservationIOPS float64 // 0: none
	limitIOPS       float64 // 0: unlimited
	shares          float64

	queue []*op // FIFO; queue[0] is the head
	// Tags of the head request (valid while len(queue) > 0), in ns for R and
	// L (real time) and in virtual ns for P.
	rTag, lTag, pTag float64
	// Tags of the last request served, the base for the next head.
	rLast, lLast, pLast float64
	served              bool
}

// mclockSched picks the next request among disks: first any request whose
// reservation tag is due (smallest R tag), else the request with the
// smallest P tag among disks under their limit.
type mclockSched struct {
	disks []*mclockDisk
	vNs   float64 // virtual time: P tag of the last request served by shares
}

func nsPer(rate float64) float64 { return 1e9 / rate }

// setHeadTags computes the tags of d's head request. R and L follow real
// time from the request's arrival (a disk cannot save up credit while idle,
// and a backlogged disk is not charged for dispatch delays); P follows
// virtual time (start-time fair queueing between backlogged disks).
func (s *mclockSched) setHeadTags(d *mclockDisk) {
	c := d.queue[0].cost
	nowNs := float64(d.queue[0].arrivalNs)
	if d.reservationIOPS > 0 {
		d.rTag = max(d.rLast+c*nsPer(d.reservationIOPS), nowNs)
		if !d.served {
			d.rTag = nowNs
		}
	}
	if d.limitIOPS > 0 {
		d.lTag = max(d.lLast+c*nsPer(d.limitIOPS), nowNs)
		if !d.served {
			d.lTag = nowNs
		}
	}
	d.pTag = max(d.pLast+c*nsPer(d.shares), s.vNs)
	if !d.served {
		d.pTag = s.vNs
	}
}

// add queues o on disk i.
func (s *mclockSched) add(i int, o *op, nowNs int64) {
	d := s.disks[i]
	o.arrivalNs = nowNs
	d.queue = append(d.queue, o)
	if len(d.queue) == 1 {
		s.setHeadTags(d)
	}
}

// next removes and returns the request to dispatch at nowNs. When nothing is
// eligible, ok is false and waitNs (if > 0) is the earliest time at which a
// limited disk becomes eligible.
func (s *mclockSched) next(nowNs int64) (o *op, ok bool, waitNs int64) {
	now := float64(nowNs)
	best := -1
	// Reservation phase.
	for i, d := range s.disks {
		if len(d.queue) == 0 || d.reservationIOPS <= 0 || d.rTag > now {
			continue
		}
		if best < 0 || d.rTag < s.disks[best].rTag {
			best = i
		}
	}
	byRes := best >= 0
	if !byRes {
		wait := -1.0
		for i, d := range s.disks {
			if len(d.queue) == 0 {
				continue
			}
			if d.limitIOPS > 0 && d.lTag > now {
				if wait < 0 || d.lTag < wait {
					wait = d.lTag
				}
				continue
			}
			if best < 0 || d.pTag < s.disks[best].pTag {
				best = i
			}
		}
		if best < 0 {
			if wait < 0 {
				return nil, false, 0
			}
			// The reservation of a waiting disk may come due earlier.
			for _, d := range s.disks {
				if len(d.queue) > 0 && d.reservationIOPS > 0 && d.rTag < wait {
					wait = d.rTag
				}
			}
			return nil, false, int64(wait) + 1
		}
	}
	d := s.disks[best]
	o = d.queue[0]
	d.queue[0] = nil
	d.queue = d.queue[1:]
	d.rLast, d.lLast = d.rTag, d.lTag
	if byRes {
		// Served by reservation: do not charge the disk's shares (mClock's
		// P-tag adjustment), so that it gets max(reservation, share).
		d.pLast = d.pTag - o.cost*nsPer(d.shares)
	} else {
		d.pLast = d.pTag
		s.vNs = max(s.vNs, d.pTag)
	}
	d.served = true
	if len(d.queue) > 0 {
		s.setHeadTags(d)
	}
	return o, true, 0
}

// queued is the number of requests waiting on disk i.
func (s *mclockSched) queued(i int) int { return len(s.disks[i].queue) }
