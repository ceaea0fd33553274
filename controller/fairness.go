package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/clock"
)

// The API's priority levels and fair queuing, after Kubernetes' API
// Priority and Fairness in small form (docs/controller.md, Security).
// Every authenticated request takes a seat of its token's level before
// it is served: the hosts' tokens have their level, the operators'
// tokens theirs, and neither can take the other's seats. A request that
// finds its level's seats taken waits in the queue of its flow (its
// host, or its operator token). A seat given back goes to the flows with
// requests waiting in turn (round robin, one request per turn), so that
// a flow holding all the seats gets only every other seat that comes
// free once a second flow waits. A long poll of the desired state holds
// its seat only for its first read: while it waits for a change it
// holds none (as APF exempts watches); a host's long polls stay capped
// at MaxWatches.
const (
	// DefaultHostSeats is how many requests of hosts' tokens are served
	// at once (sluice controller --host-seats).
	DefaultHostSeats = 64
	// DefaultOperatorSeats is how many requests of operators' tokens are
	// served at once (sluice controller --operator-seats).
	DefaultOperatorSeats = 16
	// DefaultQueueLength is how many requests of one flow wait for a
	// seat at most; one beyond gets 429 with Retry-After at once. (A
	// host's flow also has at most MaxInFlight + MaxWatches under way.)
	DefaultQueueLength = 64
	// DefaultQueueWait bounds a request's wait for a seat; one that waits
	// longer gets 429 with Retry-After.
	DefaultQueueWait = 10 * time.Second
)

// Fairness sizes the API's priority levels (HandlerLimits). A zero
// field means its default.
type Fairness struct {
	// HostSeats and OperatorSeats are the seats of the two levels:
	// requests of hosts' tokens, and of operators' tokens.
	HostSeats, OperatorSeats int
	// QueueLength is how many requests of one flow wait at most.
	QueueLength int
	// QueueWait bounds the wait of one request.
	QueueWait time.Duration
	// Clock times the waits; nil: real time.
	Clock clock.Clock
}

func (f Fairness) withDefaults() Fairness {
	or := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	f.HostSeats = or(f.HostSeats, DefaultHostSeats)
	f.OperatorSeats = or(f.OperatorSeats, DefaultOperatorSeats)
	f.QueueLength = or(f.QueueLength, DefaultQueueLength)
	if f.QueueWait <= 0 {
		f.QueueWait = DefaultQueueWait
	}
	f.Clock = clock.Or(f.Clock)
	return f
}

// Why a request got no seat.
var (
	errQueueFull = errors.New("queue full")
	errWaited    = errors.New("waited too long")
)

// level is one priority level: seats requests are served at once, the
// others wait in their flow's queue (at most queueLen each, for at most
// wait), and a seat given back goes to the flows with requests waiting
// in turn.
type level struct {
	name     string // "hosts", "operators"
	seats    int
	queueLen int
	wait     time.Duration
	clock    clock.Clock

	mu      sync.Mutex
	inUse   int
	waiting int                  // requests in all the queues
	queues  map[string][]*waiter // by flow, oldest first; no empty queue
	turn    []string             // the flows with requests waiting, next served first
	// changed, if set (tests), is called under mu after every change.
	changed func()

	inUseG, waitingG prometheus.Gauge
	full, waited     prometheus.Counter
}

// waiter is a request waiting for a seat.
type waiter struct {
	flow    string
	ready   chan struct{} // closed when it was handed a seat
	granted bool          // under mu
}

func newLevel(name string, seats int, f Fairness, m *metrics) *level {
	m.seats.WithLabelValues(name).Set(float64(seats))
	return &level{name: name, seats: seats, queueLen: f.QueueLength, wait: f.QueueWait, clock: f.Clock,
		queues: map[string][]*waiter{},
		inUseG: m.seatsInUse.WithLabelValues(name), waitingG: m.waiting.WithLabelValues(name),
		full: m.rejected.WithLabelValues(name, "queue-full"), waited: m.rejected.WithLabelValues(name, "wait")}
}

// seat is a seat taken; release gives it back (once; a nil seat is
// none).
type seat struct {
	l    *level
	once sync.Once
}

func (s *seat) release() {
	if s != nil {
		s.once.Do(s.l.leave)
	}
}

// enter takes a seat for a request of flow, waiting in flow's queue
// while the seats are taken. It fails with errQueueFull when the queue
// is full, errWaited when the wait passed, or ctx's error.
func (l *level) enter(ctx context.Context, flow string) (*seat, error) {
	l.mu.Lock()
	if l.inUse < l.seats && l.waiting == 0 {
		l.inUse++
		l.inUseG.Inc()
		l.note()
		l.mu.Unlock()
		return &seat{l: l}, nil
	}
	q := l.queues[flow]
	if len(q) >= l.queueLen {
		l.mu.Unlock()
		l.full.Inc()
		return nil, errQueueFull
	}
	w := &waiter{flow: flow, ready: make(chan struct{})}
	if len(q) == 0 {
		l.turn = append(l.turn, flow)
	}
	l.queues[flow] = append(q, w)
	l.waiting++
	l.waitingG.Inc()
	l.note()
	l.mu.Unlock()

	timeout := make(chan struct{})
	stop := l.clock.AfterFunc(l.wait, func() { close(timeout) })
	defer stop()
	var why error
	select {
	case <-w.ready:
		return &seat{l: l}, nil
	case <-timeout:
		why = errWaited
	case <-ctx.Done():
		why = ctx.Err()
	}
	l.mu.Lock()
	granted := w.granted
	if !granted {
		l.drop(w)
	}
	l.mu.Unlock()
	switch {
	case granted && why == errWaited:
		return &seat{l: l}, nil // handed a seat as the wait ended: served
	case granted:
		l.leave() // the client is gone: the seat goes on
	case why == errWaited:
		l.waited.Inc()
	}
	return nil, why
}

// leave gives a seat back: to the next flow in turn with a request
// waiting, else to the free seats.
func (l *level) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.turn) == 0 {
		l.inUse--
		l.inUseG.Dec()
		l.note()
		return
	}
	flow := l.turn[0]
	l.turn = l.turn[1:]
	q := l.queues[flow]
	w := q[0]
	if len(q) == 1 {
		delete(l.queues, flow)
	} else {
		l.queues[flow] = q[1:]
		l.turn = append(l.turn, flow) // its next request waits a turn
	}
	l.waiting--
	l.waitingG.Dec()
	w.granted = true
	close(w.ready)
	l.note()
}

// drop takes w, which gave up waiting, out of its queue (under mu).
func (l *level) drop(w *waiter) {
	q := slices.DeleteFunc(l.queues[w.flow], func(x *waiter) bool { return x == w })
	if len(q) == 0 {
		delete(l.queues, w.flow)
		l.turn = slices.DeleteFunc(l.turn, func(f string) bool { return f == w.flow })
	} else {
		l.queues[w.flow] = q
	}
	l.waiting--
	l.waitingG.Dec()
	l.note()
}

func (l *level) note() {
	if l.changed != nil {
		l.changed()
	}
}

// refuse answers a request of flow that got no seat of l: 429 with
// Retry-After when its queue was full or its wait passed, 503 when it
// was cancelled while waiting (its client is gone, or the server stops).
func (l *level) refuse(w http.ResponseWriter, flow string, err error) {
	switch {
	case errors.Is(err, errQueueFull):
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: fmt.Sprintf("the %s' %d seats are taken and %d requests of %s wait already: retry in a second", l.name, l.seats, l.queueLen, flow)})
	case errors.Is(err, errWaited):
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: fmt.Sprintf("none of the %s' %d seats came free within %v: retry in a second", l.name, l.seats, l.wait)})
	default:
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "cancelled while waiting for a seat"})
	}
}

type seatKey struct{}

// seatOf is the seat r holds (nil: none).
func seatOf(r *http.Request) *seat {
	s, _ := r.Context().Value(seatKey{}).(*seat)
	return s
}
