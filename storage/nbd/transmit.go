package nbd

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// request is one decoded transmission-phase request.
type request struct {
	flags  uint16
	typ    uint16
	handle uint64
	off    uint64
	length uint32
	data   []byte // WRITE payload
}

// transmission serves requests until DISC, EOF or a protocol violation.
// Requests are processed concurrently (up to MaxInFlight) and answered in
// completion order.
func (c *serverConn) transmission(b Backend, name string) error {
	max := c.s.MaxInFlight
	if max <= 0 {
		max = 128
	}
	// Replies are written into the buffer by the workers and flushed by one
	// flusher goroutine, so that replies completing together share a write
	// system call.
	c.flushReq = make(chan struct{}, 1)
	flusherDone := make(chan struct{})
	go c.flusher(flusherDone)
	// Requests run on a pool of up to max long-lived workers.
	work := make(chan request)
	workers := 0
	var inflight sync.WaitGroup
	defer func() {
		close(work)
		inflight.Wait() // never close the conn under a running request's reply
		close(c.flushReq)
		<-flusherDone
	}()
	size := b.SizeBytes()
	for {
		var h [28]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return err
		}
		if m := binary.BigEndian.Uint32(h[0:]); m != requestMagic {
			return violationf("export %s: bad request magic %#x", name, m)
		}
		req := request{
			flags:  binary.BigEndian.Uint16(h[4:]),
			typ:    binary.BigEndian.Uint16(h[6:]),
			handle: binary.BigEndian.Uint64(h[8:]),
			off:    binary.BigEndian.Uint64(h[16:]),
			length: binary.BigEndian.Uint32(h[24:]),
		}
		if req.typ == CmdWrite {
			if req.length > MaxPayloadBytes {
				// The payload cannot be skipped safely: end the connection.
				return violationf("export %s: WRITE of %d bytes exceeds the maximum %d", name, req.length, MaxPayloadBytes)
			}
			req.data = getBuf(int(req.length))
			if _, err := io.ReadFull(c.r, req.data); err != nil {
				return err
			}
		}
		if req.typ == CmdDisc {
			return nil // the deferred clean-up finishes the requests in flight
		}
		if errno := check(req, size); errno != 0 {
			if err := c.reply(req.handle, errno, nil); err != nil {
				return err
			}
			continue
		}
		c.active.Add(1)
		select {
		case work <- req: // an idle worker took it
		default:
			if workers < max {
				workers++
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					c.serve(b, req)
					for r := range work {
						c.serve(b, r)
					}
				}()
			} else {
				work <- req // back-pressure: wait for a worker
			}
		}
	}
}

// flusher flushes the reply buffer whenever replies were written, until
// flushReq is closed; then it flushes once more.
func (c *serverConn) flusher(done chan struct{}) {
	defer close(done)
	for range c.flushReq {
		c.wmu.Lock()
		err := c.w.Flush()
		c.wmu.Unlock()
		if err != nil {
			_ = c.rw.Close()
		}
	}
	c.wmu.Lock()
	_ = c.w.Flush()
	c.wmu.Unlock()
}

// check validates a request against the export; 0 means it may proceed.
func check(req request, size uint64) uint32 {
	switch req.typ {
	case CmdRead, CmdWrite, CmdTrim:
		end := req.off + uint64(req.length)
		if end < req.off || end > size {
			if req.typ == CmdWrite {
				return ENOSPC
			}
			return EINVAL
		}
		if req.typ == CmdRead && req.length > MaxPayloadBytes {
			return EOVERFLOW
		}
		return 0
	case CmdFlush:
		if req.off != 0 || req.length != 0 {
			return EINVAL
		}
		return 0
	}
	return EINVAL
}

// serve runs one request on the backend and sends its reply. A panic in the
// backend fails the request with EIO instead of taking the process down.
func (c *serverConn) serve(b Backend, req request) {
	var buf []byte
	errno := uint32(0)
	func() {
		defer func() {
			if r := recover(); r != nil {
				c.s.logf("nbd: backend panic on request type %d: %v", req.typ, r)
				errno = EIO
			}
		}()
		var err error
		switch req.typ {
		case CmdRead:
			buf = getBuf(int(req.length))
			err = b.ReadAt(buf, req.off)
		case CmdWrite:
			err = b.WriteAt(req.data, req.off, req.flags&CmdFlagFUA != 0)
		case CmdFlush:
			err = b.Flush()
		case CmdTrim:
			err = b.Trim(req.off, uint64(req.length))
		default:
			err = &Error{Errno: EINVAL}
		}
		if err != nil {
			errno = errnoOf(err)
		}
	}()
	if errno != 0 {
		buf = nil
	}
	err := c.reply(req.handle, errno, buf)
	c.active.Add(-1)
	putBuf(buf)
	putBuf(req.data)
	if err != nil {
		// The connection is gone; the reader will notice and end.
		_ = c.rw.Close()
	}
}

// Buffers of 4 KiB to 1 MiB are reused across requests, in power-of-two
// size classes.
const (
	minPoolShift = 12
	maxPoolShift = 20
)

var bufPools [maxPoolShift + 1]sync.Pool

func poolClass(n int) int {
	c := minPoolShift
	for 1<<c < n {
		c++
	}
	return c
}

func getBuf(n int) []byte {
	c := poolClass(n)
	if c > maxPoolShift {
		return make([]byte, n)
	}
	if b, ok := bufPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<c)
}

func putBuf(b []byte) {
	c := poolClass(cap(b))
	if c <= maxPoolShift && cap(b) == 1<<c {
		b = b[:cap(b)]
		bufPools[c].Put(&b)
	}
}

// reply queues one simple reply (the payload follows only for a good READ)
// and asks the flusher to send it.
func (c *serverConn) reply(handle uint64, errno uint32, data []byte) error {
	var h [16]byte
	binary.BigEndian.PutUint32(h[0:], simpleMagic)
	binary.BigEndian.PutUint32(h[4:], errno)
	binary.BigEndian.PutUint64(h[8:], handle)
	c.wmu.Lock()
	_, err := c.w.Write(h[:])
	if err == nil {
		_, err = c.w.Write(data)
	}
	if err == nil && c.active.Load() <= 1 {
		// No other request in flight (queue depth 1): send now rather
		// than hand over to the flusher.
		err = c.w.Flush()
		c.wmu.Unlock()
		if err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		return nil
	}
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	select {
	case c.flushReq <- struct{}{}:
	default: // a flush is already pending and will include this reply
	}
	return nil
}
