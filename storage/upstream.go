package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"sluice/storage/nbd"
)

// upstream is the gateway's connection to one datastore export. It
// reconnects when the connection fails and retries the failed request, so a
// datastore restart shows up as latency, not as errors, for up to
// retryWindow.
type upstream struct {
	clk                   Clock
	network, addr, export string
	retryWindow           time.Duration
	pollNs                int64 // nbd.DialPoll

	mu     sync.Mutex
	client *nbd.Client
	closed bool
}

func newUpstream(clk Clock, uri string, pollNs int64) (*upstream, error) {
	network, addr, export, err := nbd.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	return &upstream{clk: clk, network: network, addr: addr, export: export, retryWindow: 15 * time.Second, pollNs: pollNs}, nil
}

// get returns a live client, dialling if needed.
func (u *upstream) get() (*nbd.Client, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, nbd.ErrClosed
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
		return nil, fmt.Errorf("connecting to %s (export %q): %w", u.addr, u.export, err)
	}
	u.client = c
	return c, nil
}

// do runs fn on a live client; connection failures are retried on a new
// connection until retryWindow has passed. Error replies from the datastore
// are returned as they are.
func (u *upstream) do(fn func(c *nbd.Client) error) error {
	deadline := u.clk.Now().Add(u.retryWindow)
	backoff := 20 * time.Millisecond
	for {
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
		if u.clk.Now().After(deadline) {
			return err
		}
		sleep(u.clk, backoff) // reconnect back-off
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
