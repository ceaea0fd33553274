package livelab

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sluice/lab"
)

// ReceiverEvery is how often Receivers reads the receivers' counters.
const ReceiverEvery = 50 * time.Millisecond

// Bounds of a sample that times one end of a judged window: read within
// MaxSpan (its time, the middle of the read, is then known to ±5 ms: ≤ 1%
// of a second), and at most MaxOff from the end it stands for.
const (
	MaxSpan = 10 * time.Millisecond
	MaxOff  = 100 * time.Millisecond
)

// Receivers samples, every ReceiverEvery, how many payload bytes the
// receiving sockets in the fabric have received, per iperf3 port: tcp_info's
// bytes_received of the established sockets on the port.
// The kernel counts bytes when they arrive, so a receiving process that
// the machine starves shifts no bytes between seconds (it can only close
// its window, which slows the sender: the class watch then sees an empty
// queue). Each sample keeps how long its read took.
type Receivers struct {
	mu      sync.Mutex
	at      []time.Time // the middle of each read
	span    []time.Duration
	bytes   []map[int]float64 // per iperf3 port
	readErr error
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// WatchReceivers starts sampling the receivers in the fabric, their
// iperf3 port found as recv says; cleanup stops it.
func WatchReceivers(t testing.TB, plan *lab.Plan, recv Receiver) *Receivers {
	t.Helper()
	return watchReceivers(t, []*netlink.Handle{fabricDiag(t, plan)}, recv)
}

// watchReceivers samples the receiving sockets that the sock_diag handles
// hs see (one per namespace), summed per iperf3 port.
func watchReceivers(t testing.TB, hs []*netlink.Handle, recv Receiver) *Receivers {
	t.Helper()
	w := &Receivers{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer func() {
			for _, h := range hs {
				h.Close()
			}
		}()
		tick := time.NewTicker(ReceiverEvery)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
				before := time.Now()
				// One goroutine per namespace: the dumps of several
				// namespaces (the inbound VMs') overlap, so that a sample's
				// span is about one namespace's, not their sum.
				parts := make([]map[int]float64, len(hs))
				errs := make([]error, len(hs))
				var wg sync.WaitGroup
				for k, h := range hs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						parts[k], errs[k] = receivedPerPort(h, recv)
					}()
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					w.mu.Lock()
					w.readErr = err
					w.mu.Unlock()
					return
				}
				m := map[int]float64{}
				for _, part := range parts {
					for port, b := range part {
						m[port] += b
					}
				}
				span := time.Since(before)
				w.mu.Lock()
				w.at = append(w.at, before.Add(span/2))
				w.span = append(w.span, span)
				w.bytes = append(w.bytes, m)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop() })
	return w
}

// receivedPerPort sums the bytes received by the established TCP
// sockets that h sees, per iperf3 port (recv says which port is the
// flow's).
func receivedPerPort(h *netlink.Handle, recv Receiver) (map[int]float64, error) {
	m := map[int]float64{}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := h.SocketDiagTCPInfo(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		for _, s := range socks {
			if s.InetDiagMsg == nil || s.TCPInfo == nil || s.InetDiagMsg.State != tcpEstablished {
				continue
			}
			key := s.InetDiagMsg.ID.SourcePort
			if recv == ClientSide {
				key = s.InetDiagMsg.ID.DestinationPort
			}
			m[int(key)] += float64(s.TCPInfo.Bytes_received)
		}
	}
	return m, nil
}

// Stop ends the sampling (idempotent) and returns a read error, if any.
func (w *Receivers) Stop() error {
	w.once.Do(func() { close(w.quit); <-w.done })
	return w.Err()
}

// Err is the error that stopped the sampling, if any.
func (w *Receivers) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readErr
}

// Rate is port's received rate in bits/s between the samples nearest to
// a and b, however long their reads took (ok false when the samples do not
// cover the window or the flow's counter went back). For watching a run
// as it goes; a verdict takes Window.
func (w *Receivers) Rate(port int, a, b time.Time) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(a) })
	j := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(b) })
	if j == len(w.at) {
		j--
	}
	if i >= len(w.at) || j <= i || w.at[j].Sub(w.at[i]) < b.Sub(a)/2 {
		return 0, false
	}
	d := w.bytes[j][port] - w.bytes[i][port]
	if d < 0 {
		return 0, false
	}
	return 8 * d / w.at[j].Sub(w.at[i]).Seconds(), true
}

// Timed is one judged window of the receivers: its two samples.
type Timed struct {
	From, To time.Time // the samples' times
	ok       bool
	why      string
}

// OK tells whether both ends were timed within MaxSpan and MaxOff; Why
// says otherwise what the reads were.
func (tw Timed) OK() bool    { return tw.ok }
func (tw Timed) Why() string { return tw.why }

// Window picks the samples that time [a, b]: for each end, of the samples
// within MaxOff of it, the one read fastest (the nearest of equals). The
// window is timed when both were read within MaxSpan.
func (w *Receivers) Window(a, b time.Time) Timed {
	w.mu.Lock()
	defer w.mu.Unlock()
	pick := func(at time.Time) (int, time.Duration) {
		best, bestSpan := -1, time.Duration(0)
		lo := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(at.Add(-MaxOff)) })
		for k := lo; k < len(w.at) && !w.at[k].After(at.Add(MaxOff)); k++ {
			if best < 0 || w.span[k] < bestSpan || (w.span[k] == bestSpan && absDur(w.at[k].Sub(at)) < absDur(w.at[best].Sub(at))) {
				best, bestSpan = k, w.span[k]
			}
		}
		return best, bestSpan
	}
	i, si := pick(a)
	j, sj := pick(b)
	switch {
	case i < 0 || j < 0:
		return Timed{why: fmt.Sprintf("no receiver sample within %v of an end (the watch's reads were late)", MaxOff)}
	case si > MaxSpan || sj > MaxSpan:
		return Timed{From: w.at[i], To: w.at[j], why: fmt.Sprintf("the fastest receiver reads near the ends took %v and %v (> %v)", si.Round(time.Millisecond), sj.Round(time.Millisecond), MaxSpan)}
	}
	return Timed{From: w.at[i], To: w.at[j], ok: true}
}

// Between is port's received rate in bits/s over a timed window (0 when
// the flow's counter went back: it restarted).
func (w *Receivers) Between(port int, tw Timed) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(tw.From) })
	j := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(tw.To) })
	if i >= len(w.at) || j >= len(w.at) || j <= i {
		return 0
	}
	d := w.bytes[j][port] - w.bytes[i][port]
	if d < 0 {
		return 0
	}
	return 8 * d / w.at[j].Sub(w.at[i]).Seconds()
}

// MinStall is the shortest hold of a receiver's in-order bytes that
// Stall reports: longer than a round trip in the lab by far, as long as a
// lost segment's repair takes (the receiver holds what arrives after the
// hole until it is filled).
const MinStall = 100 * time.Millisecond

// Stall tells whether port's receiver made (almost) no in-order progress
// across time at: from the last sample before at to the first after it,
// widened to every neighbouring sample pair whose progress stayed under a
// tenth of what rate (bits/s) delivers in the same time, for at least
// MinStall. It returns the stall's bounds.
func (w *Receivers) Stall(port int, at time.Time, rate float64) (from, to time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := sort.Search(len(w.at), func(i int) bool { return !w.at[i].Before(at) })
	if j == 0 || j >= len(w.at) {
		return time.Time{}, time.Time{}, false
	}
	slow := func(k int) bool { // the pair k-1, k
		want := rate / 8 * w.at[k].Sub(w.at[k-1]).Seconds()
		return w.bytes[k][port]-w.bytes[k-1][port] < 0.1*want
	}
	if !slow(j) {
		return time.Time{}, time.Time{}, false
	}
	l, r := j-1, j
	for l > 0 && slow(l) {
		l--
	}
	for r+1 < len(w.at) && slow(r+1) {
		r++
	}
	if w.at[r].Sub(w.at[l]) < MinStall {
		return time.Time{}, time.Time{}, false
	}
	return w.at[l], w.at[r], true
}

// Reads describes the reads of the counters from a to b: how many, and
// how long they took (median and maximum) and the longest gap between
// them: the evidence when windows were not timed.
func (w *Receivers) Reads(a, b time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var spans []time.Duration
	gap, last := time.Duration(0), time.Time{}
	for k, at := range w.at {
		if at.Before(a) || at.After(b) {
			continue
		}
		spans = append(spans, w.span[k])
		if !last.IsZero() {
			gap = max(gap, at.Sub(last))
		}
		last = at
	}
	if len(spans) == 0 {
		return "no receiver reads"
	}
	slices.Sort(spans)
	return fmt.Sprintf("%d receiver reads (one due every %v): each took %v median, %v at most; the longest gap between two %v",
		len(spans), ReceiverEvery, spans[len(spans)/2].Round(100*time.Microsecond), spans[len(spans)-1].Round(100*time.Microsecond), gap.Round(time.Millisecond))
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
