package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestPolledRoundTrip: with polling on both sides (and off), with one P and
// with the default, concurrent writes of up to 1 MiB (socket buffers fill:
// writes wait in the netpoller) read back intact, and a queue-depth-1 loop
// of reads answers every request.
func TestPolledRoundTrip(t *testing.T) {
	for _, procs := range []int{1, 0} {
		for _, pollNs := range []int64{0, 50_000, 5_000_000} {
			t.Run(fmt.Sprintf("procs=%d/poll=%dns", procs, pollNs), func(t *testing.T) {
				if procs > 0 {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				}
				mem := &memBackend{data: make([]byte, 32<<20)}
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				s := &Server{Exports: MapExports{"d": mem}, PollNs: pollNs}
				go s.Serve(l)
				defer s.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				c, err := DialPoll(ctx, "tcp", l.Addr().String(), "d", pollNs)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				var wg sync.WaitGroup
				errs := make(chan error, 32)
				for i := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						n := 4096 << (i % 9) // 4 KiB … 1 MiB
						p := make([]byte, n)
						rand.New(rand.NewSource(int64(i))).Read(p)
						off := uint64(i) * (1 << 20)
						if err := c.WriteAt(p, off, false); err != nil {
							errs <- err
							return
						}
						q := make([]byte, n)
						if err := c.ReadAt(q, off); err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(p, q) {
							errs <- fmt.Errorf("request %d: data read back differs", i)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				q := make([]byte, 4096)
				for i := range 200 {
					if err := c.ReadAt(q, uint64(i%32)<<20); err != nil {
						t.Fatalf("read %d: %v", i, err)
					}
				}
			})
		}
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); acc <- c }()
	a, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestPollConnWakeAndDeadline: a parked reader woken by activity keeps
// waiting for data (the wake-up is not an error) and returns the data when
// it comes; a real read deadline still fails the read once polling is over;
// Close ends a polling reader at once, not after the poll time.
func TestPollConnWakeAndDeadline(t *testing.T) {
	a, b := tcpPair(t)
	pc := newPollConn(a, int64(10*time.Millisecond))
	type res struct {
		s   string
		err error
	}
	got := make(chan res, 1)
	go func() {
		buf := make([]byte, 16)
		n, err := pc.Read(buf)
		got <- res{string(buf[:n]), err}
	}()
	// Wake the reader repeatedly while it is parked or polling.
	for range 20 {
		activity(pc)
		time.Sleep(time.Millisecond) // lets the reader park between wake-ups; not synchronisation
	}
	select {
	case r := <-got:
		t.Fatalf("read returned before data was sent: %q, %v", r.s, r.err)
	default:
	}
	if _, err := b.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.s != "hello" {
		t.Fatalf("read = %q, %v; want hello, nil", r.s, r.err)
	}

	// After polling ended, a deadline set by the caller is reported.
	time.Sleep(15 * time.Millisecond) // past the poll time of the last activity
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
	if _, err := pc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with deadline: %v, want deadline exceeded", err)
	}
	_ = pc.SetReadDeadline(time.Time{})

	// Close stops a polling reader well before its poll time ends.
	long := newPollConn(b, int64(time.Minute))
	activity(long)
	done := make(chan error, 1)
	go func() { _, err := long.Read(make([]byte, 1)); done <- err }()
	time.Sleep(2 * time.Millisecond) // let it start polling; not synchronisation
	start := time.Now()
	long.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read on a closed connection succeeded")
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("read ended %v after Close", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("polling read did not end after Close")
	}
}

// TestPollAdaptive: when answers keep coming later than the poll time (a
// slow device), polling stops after maxMisses misses except for one probe in
// probeEvery activity calls; an answer within the poll time turns it on
// again.
func TestPollAdaptive(t *testing.T) {
	a, b := tcpPair(t)
	// A poll time far above the machine's scheduling hiccups: a miss is
	// counted only when the reader starts polling within it, and with 200 µs
	// a reader descheduled between activity and its first read (seen on a
	// Firecracker VM under load) counted 3 misses of 4. The answers come
	// later still.
	const pollTime, slowAnswer = 50 * time.Millisecond, 200 * time.Millisecond
	pc := newPollConn(a, int64(pollTime)).(*pollConn)
	buf := make([]byte, 8)
	exchange := func(delay time.Duration) {
		t.Helper()
		activity(pc)
		go func() {
			time.Sleep(delay) // the peer's service time; not synchronisation
			b.Write([]byte("x"))
		}()
		if _, err := pc.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	for range maxMisses {
		exchange(slowAnswer)
	}
	if m := pc.misses.Load(); m < maxMisses {
		t.Fatalf("misses after %d slow answers: %d", maxMisses, m)
	}
	polled := 0
	for range 2 * probeEvery {
		before := pc.spinUntil.Load()
		activity(pc)
		if pc.spinUntil.Load() != before {
			polled++
		}
	}
	if polled != 2 {
		t.Fatalf("with polling off, %d of %d activity calls polled, want 2 probes", polled, 2*probeEvery)
	}
	// An answer that arrives while a probe polls turns polling on again.
	pc.spinUntil.Store(monoNs() + int64(10*time.Second))
	go func() {
		time.Sleep(time.Millisecond) // the peer's service time; not synchronisation
		b.Write([]byte("y"))
	}()
	if _, err := pc.Read(buf); err != nil {
		t.Fatal(err)
	}
	if m := pc.misses.Load(); m != 0 {
		t.Fatalf("misses after an answer found by polling: %d, want 0", m)
	}
}

// TestPollKickNotLost: activity calls racing with a reader that is parked,
// woken and reading never leave a wake-up armed without its deadline (which
// would disable wake-ups on the connection for good): once the activity
// calls have returned, a read of data that is already there consumes any
// pending wake-up, so none is left armed. Reads see only the data.
func TestPollKickNotLost(t *testing.T) {
	a, b := tcpPair(t)
	pc := newPollConn(a, int64(20*time.Microsecond)).(*pollConn)
	buf := make([]byte, 1)
	for round := range 300 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					activity(pc)
					runtime.Gosched()
				}
			}()
		}
		go func() {
			runtime.Gosched()
			b.Write([]byte{byte(round)})
		}()
		if _, err := pc.Read(buf); err != nil || buf[0] != byte(round) {
			t.Fatalf("round %d: read %v, %v", round, buf, err)
		}
		wg.Wait()
		if _, err := b.Write([]byte{'z'}); err != nil {
			t.Fatal(err)
		}
		if _, err := pc.Read(buf); err != nil || buf[0] != 'z' {
			t.Fatalf("round %d: read %q, %v", round, buf, err)
		}
		if pc.kicked.Load() {
			t.Fatalf("round %d: a wake-up is still armed after a read", round)
		}
	}
}

// TestServerPollsOnlyAlone: the server polls a client's socket for its next
// request only while that client is its only connection; with a second
// client connected, a reply arms no polling (a poller would hide the other
// client's requests from Go's scheduler).
func TestServerPollsOnlyAlone(t *testing.T) {
	mem := &memBackend{data: make([]byte, 1<<20)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Exports: MapExports{"d": mem}, PollNs: int64(time.Minute)}
	go s.Serve(l)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// polled returns whether some server connection's poll time is armed,
	// and disarms them all.
	polled := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		armed := false
		for c := range s.conns {
			if pc, ok := c.(*pollConn); ok {
				armed = armed || pc.spinUntil.Swap(0) != 0
			}
		}
		return armed
	}
	buf := make([]byte, 4096)
	a, err := Dial(ctx, "tcp", l.Addr().String(), "d")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !polled() {
		t.Fatal("a reply to the only client armed no polling")
	}
	b, err := Dial(ctx, "tcp", l.Addr().String(), "d")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []*Client{a, b, a} {
		if err := c.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
		if polled() {
			t.Fatal("a reply armed polling while two clients are connected")
		}
	}
}
