package mclock

import (
	"fmt"
	"math"
)

// Never is the time of an event that will not happen: Pull returns it as
// nextEligibleNs when no request is queued.
const Never int64 = math.MaxInt64

// farPast is the tag base of a new client (far enough to never overflow).
const farPast int64 = -1 << 62

// DefaultChunkBytes is the size that counts as one I/O (32 KiB).
const DefaultChunkBytes = 32 << 10

// AtLimit says what to do with a client that has requests but is at its
// limit.
type AtLimit uint8

const (
	// Wait holds a client at its limit until its limit tag is due, even if
	// the device would otherwise idle (limits are hard caps, as in alloc).
	Wait AtLimit = iota
	// AllowWhenIdle serves a client at its limit when no other request
	// could be served, so that the device never idles while work is queued.
	// Such service is free: it advances neither the client's P tag nor
	// (beyond now) its L tag, so the client is not penalized later.
	AllowWhenIdle
)

func (a AtLimit) String() string {
	if a == AllowWhenIdle {
		return "allow-when-idle"
	}
	return "wait"
}

// Config configures a Scheduler. The zero value is ready to use.
type Config struct {
	// ChunkBytes is the request size that counts as one unit of cost; a
	// request of b bytes costs ceil(b/ChunkBytes), at least 1. 0 means
	// DefaultChunkBytes.
	ChunkBytes int64
	// AtLimit is the policy for clients at their limit (default Wait).
	AtLimit AtLimit
	// LimitBurstNs is how far behind now a backlogged client's L tag may
	// fall: after other clients held it below its limit (a burst of
	// higher-share work, a non-preemptible large request), it may make up
	// that much time's worth of its limit. Over any window of W ns a
	// client thus receives at most LimitIOPS·(W + LimitBurstNs)/1e9 plus
	// two requests (one at the window's edge, one that came due by
	// reservation: the constraint phase does not look at L tags). Without it, a limited client whose competitors are
	// bursty would get less than its limit in the long run. 0 means
	// DefaultLimitBurstNs; negative means none. A client that was idle
	// gets no burst: its L tag starts at its arrival.
	LimitBurstNs int64
}

// DefaultLimitBurstNs is the default Config.LimitBurstNs (100 ms).
const DefaultLimitBurstNs = 100_000_000

// Params are a client's settings. Rates are in cost units per second
// (IOPS of ChunkBytes-sized requests).
type Params struct {
	// ReservationIOPS is the guaranteed minimum rate; 0 for none.
	ReservationIOPS float64
	// Shares is the client's weight for capacity beyond reservations; > 0.
	Shares float64
	// LimitIOPS is the maximum rate; 0 or +Inf means unlimited. Must not be
	// below ReservationIOPS.
	LimitIOPS float64
}

func (p Params) validate() error {
	switch {
	case math.IsNaN(p.ReservationIOPS) || p.ReservationIOPS < 0 || math.IsInf(p.ReservationIOPS, 0):
		return fmt.Errorf("reservation %v IOPS: must be finite and ≥ 0", p.ReservationIOPS)
	case math.IsNaN(p.Shares) || p.Shares <= 0 || math.IsInf(p.Shares, 0):
		return fmt.Errorf("shares %v: must be finite and > 0", p.Shares)
	case math.IsNaN(p.LimitIOPS) || p.LimitIOPS < 0:
		return fmt.Errorf("limit %v IOPS: must be ≥ 0 (0 for unlimited)", p.LimitIOPS)
	case p.LimitIOPS > 0 && p.LimitIOPS < p.ReservationIOPS:
		return fmt.Errorf("limit %v IOPS is below reservation %v IOPS", p.LimitIOPS, p.ReservationIOPS)
	}
	return nil
}

// Request is one I/O request. Only Bytes, Delta and Rho are read; Handle is
// the caller's and comes back unchanged from Pull.
type Request struct {
	// Bytes is the request size; it sets the cost (see Config.ChunkBytes).
	Bytes int64
	// Delta (dmClock) is the cost served for this client by other servers
	// since its previous request to this one; 0 with a single server. It
	// advances the L and P tags.
	Delta uint32
	// Rho (dmClock) is the part of Delta that the other servers served in
	// their constraint (reservation) phase. It advances the R tag.
	Rho uint32
	// Handle identifies the request to the caller.
	Handle uint64
}

// Phase says why a request was served.
type Phase uint8

const (
	// NoPhase: nothing was served.
	NoPhase Phase = iota
	// Reservation: served in the constraint phase (R tag due).
	Reservation
	// Weight: served in the weight phase (smallest P tag under the limit).
	Weight
	// OverLimit: served above the limit because the device would otherwise
	// idle (AllowWhenIdle only).
	OverLimit
)

func (p Phase) String() string {
	switch p {
	case Reservation:
		return "resv"
	case Weight:
		return "weight"
	case OverLimit:
		return "overlimit"
	}
	return "none"
}

// ClientStats are a client's counters since AddClient.
type ClientStats struct {
	Queued        int    // requests waiting
	Served        uint64 // requests served
	ServedCost    uint64 // cost units served
	ByReservation uint64 // cost units served in the constraint phase
	ByWeight      uint64 // cost units served in the weight phase
	OverLimit     uint64 // cost units served above the limit (AllowWhenIdle)
}
