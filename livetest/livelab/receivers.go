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
// queue). Each sample keeps how long its read took. Receivers that live
// in several namespaces (the VMs of inbound runs) are read one namespace
// at a time, each on a ticker of its own offset from the others' so that
// their reads do not compete for the CPUs, and each port is timed by its
// own namespace's samples.
type Receivers struct {
	mu      sync.Mutex
	series              // the samples of the first namespace (the only one of most watches)
	more    []*series   // of the other namespaces
	of      map[int]int // port → its namespace's index (0: the first; ports not seen: 0)
	readErr error
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// series are the samples of one namespace's receivers.
type series struct {
	at    []time.Time // the middle of each read
	span  []time.Duration
	bytes []map[int]float64 // per iperf3 port
}

// all is every namespace's series, the first first.
func (w *Receivers) all() []*series { return append([]*series{&w.series}, w.more...) }

// ns is namespace k's series (0: the first).
func (w *Receivers) ns(k int) *series {
	if k > 0 && k <= len(w.more) {
		return w.more[k-1]
	}
	return &w.series
}

// seriesOf is the series port is counted in.
func (w *Receivers) seriesOf(port int) *series { return w.ns(w.of[port]) }

// WatchReceivers starts sampling the receivers in the fabric, their
// iperf3 port found as recv says; cleanup stops it.
func WatchReceivers(t testing.TB, plan *lab.Plan, recv Receiver) *Receivers {
	t.Helper()
	return watchReceivers(t, []*netlink.Handle{fabricDiag(t, plan)}, recv)
}

// watchReceivers samples the receiving sockets that the sock_diag handles
// hs see (one per namespace), per iperf3 port; the namespaces are read on
// tickers offset by ReceiverEvery/len(hs) from each other.
func watchReceivers(t testing.TB, hs []*netlink.Handle, recv Receiver) *Receivers {
	t.Helper()
	w := &Receivers{quit: make(chan struct{}), done: make(chan struct{}), of: map[int]int{}}
	for range hs[1:] {
		w.more = append(w.more, &series{})
	}
	var wg sync.WaitGroup
	for k, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.Close()
			w.sample(k, h, recv, time.Duration(k)*ReceiverEvery/time.Duration(len(hs)))
		}()
	}
	go func() { wg.Wait(); close(w.done) }()
	t.Cleanup(func() { w.Stop() })
	return w
}

// sample reads namespace k's receivers through h every ReceiverEvery,
// the first read offset after the start, until the watch stops or a
// read fails.
func (w *Receivers) sample(k int, h *netlink.Handle, recv Receiver, offset time.Duration) {
	start := time.NewTimer(offset)
	select {
	case <-w.quit:
		start.Stop()
		return
	case <-start.C:
	}
	tick := time.NewTicker(ReceiverEvery)
	defer tick.Stop()
	for {
		before := time.Now()
		m, err := receivedPerPort(h, recv)
		if err != nil {
			w.mu.Lock()
			w.readErr = errors.Join(w.readErr, err)
			w.mu.Unlock()
			return
		}
		span := time.Since(before)
		w.mu.Lock()
		sr := w.ns(k)
		sr.at = append(sr.at, before.Add(span/2))
		sr.span = append(sr.span, span)
		sr.bytes = append(sr.bytes, m)
		for port := range m {
			w.of[port] = k
		}
		w.mu.Unlock()
		select {
		case <-w.quit:
			return
		case <-tick.C:
		}
	}
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
	sr := w.seriesOf(port)
	i := sort.Search(len(sr.at), func(i int) bool { return !sr.at[i].Before(a) })
	j := sort.Search(len(sr.at), func(i int) bool { return !sr.at[i].Before(b) })
	if j == len(sr.at) {
		j--
	}
	if i >= len(sr.at) || j <= i || sr.at[j].Sub(sr.at[i]) < b.Sub(a)/2 {
		return 0, false
	}
	d := sr.bytes[j][port] - sr.bytes[i][port]
	if d < 0 {
		return 0, false
	}
	return 8 * d / sr.at[j].Sub(sr.at[i]).Seconds(), true
}

// Timed is one judged window of the receivers: its two samples in each
// namespace.
type Timed struct {
	From, To time.Time // the samples' times (several namespaces: the earliest and the latest)
	ok       bool
	why      string
	ends     [][2]int // per namespace, its two samples
}

// OK tells whether both ends were timed within MaxSpan and MaxOff; Why
// says otherwise what the reads were.
func (tw Timed) OK() bool    { return tw.ok }
func (tw Timed) Why() string { return tw.why }

// Window picks, in each namespace, the samples that time [a, b]: for each
// end, of the samples within MaxOff of it, the one read fastest (the
// nearest of equals). The window is timed when every one of them was
// read within MaxSpan.
func (w *Receivers) Window(a, b time.Time) Timed {
	w.mu.Lock()
	defer w.mu.Unlock()
	var tw Timed
	for _, sr := range w.all() {
		i, si := sr.pick(a)
		j, sj := sr.pick(b)
		switch {
		case i < 0 || j < 0:
			return Timed{why: fmt.Sprintf("no receiver sample within %v of an end (the watch's reads were late)", MaxOff)}
		case si > MaxSpan || sj > MaxSpan:
			return Timed{From: sr.at[i], To: sr.at[j], why: fmt.Sprintf("the fastest receiver reads near the ends took %v and %v (> %v)", si.Round(time.Millisecond), sj.Round(time.Millisecond), MaxSpan)}
		}
		if len(tw.ends) == 0 || sr.at[i].Before(tw.From) {
			tw.From = sr.at[i]
		}
		if len(tw.ends) == 0 || sr.at[j].After(tw.To) {
			tw.To = sr.at[j]
		}
		tw.ends = append(tw.ends, [2]int{i, j})
	}
	tw.ok = true
	return tw
}

// pick is the sample of sr that times the end at: of those within MaxOff
// of it, the one read fastest (the nearest of equals); -1 when none.
func (sr *series) pick(at time.Time) (int, time.Duration) {
	best, bestSpan := -1, time.Duration(0)
	lo := sort.Search(len(sr.at), func(i int) bool { return !sr.at[i].Before(at.Add(-MaxOff)) })
	for k := lo; k < len(sr.at) && !sr.at[k].After(at.Add(MaxOff)); k++ {
		if best < 0 || sr.span[k] < bestSpan || (sr.span[k] == bestSpan && absDur(sr.at[k].Sub(at)) < absDur(sr.at[best].Sub(at))) {
			best, bestSpan = k, sr.span[k]
		}
	}
	return best, bestSpan
}

// Ends are the times of the two samples that time port in tw (its
// namespace's).
func (w *Receivers) Ends(port int, tw Timed) (from, to time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.of[port]
	if !tw.ok || k >= len(tw.ends) {
		return tw.From, tw.To
	}
	sr := w.ns(k)
	return sr.at[tw.ends[k][0]], sr.at[tw.ends[k][1]]
}

// Between is port's received rate in bits/s over a timed window (0 when
// the flow's counter went back: it restarted).
func (w *Receivers) Between(port int, tw Timed) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.of[port]
	if !tw.ok || k >= len(tw.ends) {
		return 0
	}
	sr := w.ns(k)
	i, j := tw.ends[k][0], tw.ends[k][1]
	if j <= i {
		return 0
	}
	d := sr.bytes[j][port] - sr.bytes[i][port]
	if d < 0 {
		return 0
	}
	return 8 * d / sr.at[j].Sub(sr.at[i]).Seconds()
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
	sr := w.seriesOf(port)
	j := sort.Search(len(sr.at), func(i int) bool { return !sr.at[i].Before(at) })
	if j == 0 || j >= len(sr.at) {
		return time.Time{}, time.Time{}, false
	}
	slow := func(k int) bool { // the pair k-1, k
		want := rate / 8 * sr.at[k].Sub(sr.at[k-1]).Seconds()
		return sr.bytes[k][port]-sr.bytes[k-1][port] < 0.1*want
	}
	if !slow(j) {
		return time.Time{}, time.Time{}, false
	}
	l, r := j-1, j
	for l > 0 && slow(l) {
		l--
	}
	for r+1 < len(sr.at) && slow(r+1) {
		r++
	}
	if sr.at[r].Sub(sr.at[l]) < MinStall {
		return time.Time{}, time.Time{}, false
	}
	return sr.at[l], sr.at[r], true
}

// Reads describes the reads of the counters from a to b: how many, and
// how long they took (median and maximum) and the longest gap between
// two of one namespace: the evidence when windows were not timed.
func (w *Receivers) Reads(a, b time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var spans []time.Duration
	gap := time.Duration(0)
	all := w.all()
	for _, sr := range all {
		last := time.Time{}
		for k, at := range sr.at {
			if at.Before(a) || at.After(b) {
				continue
			}
			spans = append(spans, sr.span[k])
			if !last.IsZero() {
				gap = max(gap, at.Sub(last))
			}
			last = at
		}
	}
	if len(spans) == 0 {
		return "no receiver reads"
	}
	slices.Sort(spans)
	where := ""
	if len(all) > 1 {
		where = fmt.Sprintf(" in each of %d namespaces", len(all))
	}
	return fmt.Sprintf("%d receiver reads (one due every %v%s): each took %v median, %v at most; the longest gap between two %v",
		len(spans), ReceiverEvery, where, spans[len(spans)/2].Round(100*time.Microsecond), spans[len(spans)-1].Round(100*time.Microsecond), gap.Round(time.Millisecond))
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
