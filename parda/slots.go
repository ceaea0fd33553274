package parda

import "math"

// Slots keeps a host's real-valued window w at a datastore: ⌊w⌋ requests
// outstanding (at least one) whenever the host has them, and one more for
// the fraction w−⌊w⌋ of the time. A backlogged host so keeps w requests
// outstanding on average and, at the latency every host sees, gets IOPS in
// proportion to its window (Little's law). Rounding instead gives windows
// of 2.1 and 2.9 the same three requests, and the same IOPS.
//
// The extra request's time is a credit: it grows by the fraction for
// every nanosecond and shrinks by one for every nanosecond the extra
// request is outstanding; the extra request may start while the credit is
// positive. The gateway and the simulator both dispatch through it.
type Slots struct {
	credit float64 // ns of the extra request's time in hand
	atNs   int64   // the time credit was brought up to
	n      int     // requests outstanding since atNs
	w      float64 // the window since atNs
}

// The credit's bounds: a host that was not backlogged for a while starts
// the extra request at once but builds no larger burst; one extra request
// that took long (a datastore that stalled) is paid back within a second
// of the fraction.
const (
	slotsMaxCreditNs = 100e6
	slotsMaxDebtNs   = 1e9
)

// slotsBase is the whole part of window w, at least one request.
func slotsBase(w float64) int {
	return max(1, int(math.Floor(w)))
}

// advance brings the credit up to nowNs.
func (s *Slots) advance(nowNs int64) {
	dt := float64(max(0, nowNs-s.atNs))
	s.atNs = max(s.atNs, nowNs)
	base := slotsBase(s.w)
	if frac := s.w - float64(base); frac > 0 {
		s.credit += frac * dt
	}
	if s.n > base {
		s.credit -= dt
	}
	s.credit = math.Min(math.Max(s.credit, -slotsMaxDebtNs), slotsMaxCreditNs)
}

// Note records that from nowNs on, n requests are outstanding under
// window w. Call it after every change of either.
func (s *Slots) Note(nowNs int64, n int, w float64) {
	s.advance(nowNs)
	s.n, s.w = n, w
}

// Allow says whether one more request may start at nowNs, with n
// outstanding under window w.
func (s *Slots) Allow(nowNs int64, n int, w float64) bool {
	s.advance(nowNs)
	base := slotsBase(w)
	switch {
	case n < base:
		return true
	case n == base && w > float64(base):
		return s.credit > 0
	}
	return false
}
