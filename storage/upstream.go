package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"sluice/internal/clock"
	"sluice/storage/nbd"
)

// upstream is the gateway's connection to one export of an NBD datastore
// (one volume). It reconnects when the connection fails and retries the
// failed request, so a datastore restart shows up as latency, not as
// errors, for up to retryWindow. Every connection after the first is
// checked by onRedial before use (same size, same datastore); a check that
// fails makes the upstream fail every request from then on.
type upstream struct {
	clk                   clock.Clock
	network, addr, export string
	retryWindow           time.Duration
	pollNs                int64 // nbd.DialPoll
	// onRedial, if set, checks a replacement connection before its first
	// request; an error fails the upstream for good.
	onRedial func(c *nbd.Client) error

	mu     sync.Mutex
	client *nbd.Client
	closed bool
	dials  int   // connections made
	failed error // sticky: set when a replacement connection failed its check
}

func newUpstream(clk clock.Clock, network, addr, export string, pollNs int64) *upstream {
	return &upstream{clk: clk, network: network, addr: addr, export: export, retryWindow: 15 * time.Second, pollNs: pollNs}
}

// errFailed marks an upstream error that retrying cannot cure.
type errFailed struct{ err error }

func (e *errFailed) Error() string { return e.err.Error() }
func (e *errFailed) Unwrap() error { return e.err }

// get returns a live client, dialling if needed.
func (u *upstream) get() (*nbd.Client, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, nbd.ErrClosed
	}
	if u.failed != nil {
		return nil, u.failed
	}
	if u.client != nil {
		select {
		case <-u.client.Done():
			u.client = nil
		default:
			return u.client, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := nbd.DialPoll(ctx, u.network, u.addr, u.export, u.pollNs)
	if err != nil {
		err = fmt.Errorf("connecting to %s (export %q): %w", u.addr, u.export, err)
		if u.dials > 0 && strings.Contains(err.Error(), "server error") {
			// The server is back but refuses the export: the datastore
			// lost the volume (or is another one). Waiting cures nothing.
			u.failed = &errFailed{err}
			return nil, u.failed
		}
		return nil, err
	}
	u.dials++
	if u.dials > 1 && u.onRedial != nil {
		if err := u.onRedial(c); err != nil {
			c.Abort()
			u.failed = &errFailed{fmt.Errorf("export %q after reconnecting: %w", u.export, err)}
			return nil, u.failed
		}
	}
	u.client = c
	return c, nil
}

// do runs fn on a live client; connection failures are retried on a new
// connection: at once the first time (the old connection may just have
// died: a restarted datastore), then with back-off until retryWindow has
// passed. Error replies from the datastore are returned as they are.
func (u *upstream) do(fn func(c *nbd.Client) error) error {
	deadline := u.clk.Now().Add(u.retryWindow)
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		c, err := u.get()
		if err == nil {
			err = fn(c)
			var ne *nbd.Error
			if err == nil || errors.As(err, &ne) {
				return err
			}
		}
		if errors.Is(err, nbd.ErrClosed) && u.isClosed() {
			return err
		}
		var fe *errFailed
		if errors.As(err, &fe) {
			return err
		}
		if attempt == 0 {
			continue
		}
		if !u.clk.Now().Before(deadline) {
			return err
		}
		clock.Sleep(u.clk, backoff) // reconnect back-off
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (u *upstream) isClosed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// sizeBytes is the size of the datastore export.
func (u *upstream) sizeBytes() (uint64, error) {
	c, err := u.get()
	if err != nil {
		return 0, err
	}
	return c.SizeBytes(), nil
}

func (u *upstream) close() {
	if c := u.shut(); c != nil {
		_ = c.Close()
	}
}

// abort is close without NBD_CMD_DISC: requests in flight fail at once.
func (u *upstream) abort() {
	if c := u.shut(); c != nil {
		c.Abort()
	}
}

// shut marks u closed (no more connections) and returns its client.
func (u *upstream) shut() *nbd.Client {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	c := u.client
	u.client = nil
	return c
}
