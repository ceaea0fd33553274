package nbd

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// pollConn is a socket connection whose reads and writes are non-blocking
// read(2)/write(2) calls made without the Go scheduler's system call
// bookkeeping (they never block: the socket is non-blocking, and EAGAIN
// parks the goroutine in Go's netpoller as net.Conn does). With
// GOMAXPROCS=1 this matters: a socket write on a small VM takes tens of µs,
// and a system call that lasts past a sysmon tick (20 µs) makes the runtime
// hand the P to another thread (a futex wake-up), then park the returning
// one: two thread switches per request, measured in docs/perf/storage.md.
//
// Optionally (pollNs > 0) its reads poll the socket for a bounded time
// before parking: bounded busy polling (as SPDK, Linux busy_poll or
// io_uring's SQPOLL idle time do). It trades CPU for latency: a reader that
// is polling when data arrives avoids a wake-up of its thread (on a VM, a
// halted vCPU's wake-up is a VM exit and an inter-processor interrupt, tens
// of µs). A read that finds no data polls only while "active": until pollNs
// after the last call of activity, and not while polls keep finding
// nothing (see maxMisses). The owner calls activity when it sent something
// that will be answered and nothing else is in flight on the connection: a
// reply to a client, which sends its next request; a request upstream.
// With more in flight (a deep queue) other answers are on their way anyway,
// and the CPUs are better left to the processes producing them: polling at
// queue depth 32 cost IOPS in the measurements. A reader already parked when activity
// is signalled is woken to poll (through a read deadline in the past,
// cleared again by the reader). Between polls the reader yields to other
// goroutines (runtime.Gosched), so that with GOMAXPROCS=1 it does not
// starve them.
//
// With polling on, the connection's read deadline belongs to the poller
// during the polled phase: callers must not use SetReadDeadline then (the
// NBD handshake, which uses deadlines, runs before any activity).
type pollConn struct {
	net.Conn
	rc     syscall.RawConn
	pollNs int64

	spinUntil atomic.Int64 // monotonic ns (monoNs) until which a read polls
	parked    atomic.Bool  // the reader is (about to be) parked in the netpoller
	kicked    atomic.Bool  // a read deadline in the past was set to wake it
	closed    atomic.Bool  // Close was called: stop polling
	misses    atomic.Int32 // polls in a row that ended without data
	skipped   atomic.Int32 // activity calls not polled since the last probe
}

// Adaptive polling: after maxMisses polls in a row found nothing (the
// answer takes longer than pollNs, e.g. a device with 1 ms service time),
// activity polls only every probeEvery-th time, until a poll finds data
// again; polling then costs little CPU where it cannot help.
const (
	maxMisses  = 4
	probeEvery = 16
)

// Close implements net.Conn; a polling reader stops polling.
func (p *pollConn) Close() error {
	p.closed.Store(true)
	return p.Conn.Close()
}

// clockBase is the origin of monoNs.
var clockBase = time.Now()

// monoNs is a monotonic clock in nanoseconds.
func monoNs() int64 { return int64(time.Since(clockBase)) }

// newPollConn wraps c (see pollConn); it returns c itself when c is not a
// socket with a raw file descriptor.
func newPollConn(c net.Conn, pollNs int64) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &pollConn{Conn: c, rc: rc, pollNs: pollNs}
}

// activity tells c's reader that an answer is expected soon: its reads poll
// for up to pollNs from now.
func activity(c any) {
	p, ok := c.(*pollConn)
	if !ok || p.pollNs <= 0 {
		return
	}
	if p.misses.Load() >= maxMisses {
		if p.skipped.Add(1) < probeEvery {
			return
		}
		p.skipped.Store(0)
	}
	p.spinUntil.Store(monoNs() + p.pollNs)
	if p.parked.Load() && !p.kicked.Swap(true) {
		_ = p.Conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// rawRead is read(2) on a non-blocking socket: it never blocks, so it needs
// no system call bookkeeping of the Go scheduler.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// rawWrite is write(2) on a non-blocking socket (see rawRead).
func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// Write implements io.Writer: all of b is written (waiting in the
// netpoller while the socket buffer is full) or an error is returned.
func (p *pollConn) Write(b []byte) (int, error) {
	n := 0
	var errno syscall.Errno
	err := p.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := rawWrite(fd, b[n:])
			switch e {
			case 0:
				n += m
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = p.opError("write", errno)
	}
	return n, err
}

func (p *pollConn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: p.Conn.LocalAddr().Network(), Source: p.Conn.LocalAddr(), Addr: p.Conn.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// polling reports whether a read that finds no data polls on.
func (p *pollConn) polling() bool {
	return monoNs() < p.spinUntil.Load() && !p.closed.Load()
}

// Read implements io.Reader: poll while active, else park.
func (p *pollConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil // not EOF (read(2) of 0 bytes returns 0)
	}
	for {
		var n int
		var errno syscall.Errno
		spun := false
		err := p.rc.Read(func(fd uintptr) bool {
			p.parked.Store(false)
			for {
				n, errno = rawRead(fd, b)
				if errno != syscall.EAGAIN {
					if spun {
						p.misses.Store(0)
					}
					return true
				}
				if p.polling() {
					spun = true
					runtime.Gosched()
					continue
				}
				// Announce the park, then look again: an activity call
				// either sees parked (and wakes us) or we see its time.
				p.parked.Store(true)
				if p.polling() {
					p.parked.Store(false)
					continue
				}
				if spun {
					p.misses.Add(1)
					spun = false
				}
				return false
			}
		})
		p.parked.Store(false)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && p.kicked.Load() {
				// Woken by activity: clear the deadline, then allow the
				// next kick. In this order a kick armed after the Store
				// sets its deadline after the clear, so it is never lost
				// (clearing after re-arming could erase a new kick's
				// deadline and leave kicked set for good: no more
				// wake-ups on this connection).
				_ = p.Conn.SetReadDeadline(time.Time{})
				p.kicked.Store(false)
				continue
			}
			return 0, err
		}
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return 0, p.opError("read", errno)
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
