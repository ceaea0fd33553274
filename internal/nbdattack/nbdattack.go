// Package nbdattack is hostile clients for tests of the storage gateway's
// isolation (issue 24): Run opens a VM's export on the VM's Unix socket
// with a raw handshake and pipelines requests, valid or not, as fast as
// the gateway answers; Flood holds idle TCP connections on a listener.
package nbdattack

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Attack is what a hostile client sends.
type Attack struct {
	Name    string
	Conns   int
	Invalid bool // READs beyond the end of the disk (EINVAL) instead of valid ones
}

// Attacks are the attacks of issue 24 that the tests run.
var Attacks = []Attack{
	{Name: "valid 4 KiB READs, 1 connection", Conns: 1},
	{Name: "invalid READs, 1 connection", Conns: 1, Invalid: true},
	{Name: "invalid READs, 4 connections", Conns: 4, Invalid: true},
}

// Window is how many requests an attacker keeps in flight per connection.
const Window = 256

// Dial opens export on the Unix socket sock with a raw fixed newstyle
// handshake (NBD_OPT_EXPORT_NAME) and returns the connection in
// transmission.
func Dial(ctx context.Context, sock, export string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (net.Conn, error) { c.Close(); return nil, fmt.Errorf("handshake: %w", err) }
	var greet [18]byte
	if _, err := io.ReadFull(c, greet[:]); err != nil {
		return fail(err)
	}
	msg := make([]byte, 4+16+len(export))
	binary.BigEndian.PutUint32(msg[0:], 1|2) // fixed newstyle, no zeroes
	binary.BigEndian.PutUint64(msg[4:], 0x49484156454F5054)
	binary.BigEndian.PutUint32(msg[12:], 1) // NBD_OPT_EXPORT_NAME
	binary.BigEndian.PutUint32(msg[16:], uint32(len(export)))
	copy(msg[20:], export)
	if _, err := c.Write(msg); err != nil {
		return fail(err)
	}
	var info [10]byte
	if _, err := io.ReadFull(c, info[:]); err != nil {
		return fail(err)
	}
	return c, nil
}

// Run pipelines up to Window 4 KiB READs per connection on a.Conns
// connections to export on sock (valid ones spread over the disk's first
// diskBytes), as fast as the gateway answers, until ctx ends. It returns
// the replies received so far and a function that waits until its
// connections are closed (after ctx ends).
func Run(ctx context.Context, sock, export string, diskBytes uint64, a Attack) (replies *atomic.Int64, wait func(), err error) {
	replies = &atomic.Int64{}
	var wg sync.WaitGroup
	for i := 0; i < a.Conns; i++ {
		c, err := Dial(ctx, sock, export)
		if err != nil {
			return nil, nil, fmt.Errorf("hostile client: %w", err)
		}
		context.AfterFunc(ctx, func() { c.Close() })
		tokens := make(chan struct{}, Window)
		for range Window {
			tokens <- struct{}{}
		}
		wg.Add(2)
		go func() { // writer: a request whenever fewer than Window are out
			defer wg.Done()
			w := bufio.NewWriterSize(c, 28*Window)
			var req [28]byte
			binary.BigEndian.PutUint32(req[0:], 0x25609513)
			binary.BigEndian.PutUint32(req[24:], 4096)
			for n := uint64(0); ; n++ {
				select {
				case <-tokens:
				default:
					if w.Flush() != nil {
						return
					}
					select {
					case <-tokens:
					case <-ctx.Done():
						return
					}
				}
				off := (n * 4096 * 7919) % diskBytes &^ 4095
				if a.Invalid {
					off = 1 << 40
				}
				binary.BigEndian.PutUint64(req[8:], n)
				binary.BigEndian.PutUint64(req[16:], off)
				if _, err := w.Write(req[:]); err != nil {
					return
				}
			}
		}()
		go func() { // reader: every reply frees a place in the window
			defer wg.Done()
			r := bufio.NewReaderSize(c, 256<<10)
			var h [16]byte
			for {
				if _, err := io.ReadFull(r, h[:]); err != nil {
					return
				}
				if binary.BigEndian.Uint32(h[4:]) == 0 {
					if _, err := r.Discard(4096); err != nil {
						return
					}
				}
				replies.Add(1)
				tokens <- struct{}{}
			}
		}()
	}
	return replies, wg.Wait, nil
}

// Flood holds n idle TCP connections to addr from the given local
// addresses (round robin), none of which ever sends a byte (a TLS
// listener's places taken by clients that never start TLS); a connection
// the server closes is opened again after reconnect. It returns once
// every connection was open at least once, with the function that stops
// them, or the first error opening one.
func Flood(addr string, n int, sources []string, reconnect time.Duration) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg, first sync.WaitGroup
	first.Add(n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(src string) {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			once := false
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					if !once {
						once = true
						errs <- err
						first.Done()
					}
					return
				}
				if !once {
					once = true
					first.Done()
				}
				stopRead := context.AfterFunc(ctx, func() { c.Close() })
				_, _ = io.Copy(io.Discard, c) // the greeting, then idle until closed
				stopRead()
				c.Close()
				select {
				case <-ctx.Done():
				case <-time.After(reconnect): // the attacker's reconnection interval
				}
			}
		}(sources[i%len(sources)])
	}
	first.Wait()
	close(errs)
	for err := range errs {
		cancel()
		wg.Wait()
		return nil, err
	}
	return func() { cancel(); wg.Wait() }, nil
}
