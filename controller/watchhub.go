package controller

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/internal/clock"
)

// desiredHub is one etcd watch of every host's desired state, shared by
// all the agents' long polls (WatchDesired). One etcd watch per poll does
// not scale: the etcd client creates the watches of a stream one after
// the other, so that with 1,000 agents polling a new watch waited tens of
// seconds to start (docs/perf/controller.md).
type desiredHub struct {
	once sync.Once
	mu   sync.Mutex
	// changed holds, per host, a channel closed at the next change of
	// its desired state (or when the watch restarts: waiters read again).
	changed map[string]chan struct{}
}

// start watches the prefix from the current revision on; it returns once
// the watch is asked for, so that a change made after any read that
// follows is delivered.
func (h *desiredHub) start(cli *clientv3.Client, prefix string) {
	h.once.Do(func() {
		h.changed = map[string]chan struct{}{}
		rev := h.watch(cli, prefix)
		go h.run(cli, prefix, rev)
	})
}

// watch returns the revision the next watch starts after.
func (h *desiredHub) watch(cli *clientv3.Client, prefix string) int64 {
	ctx, cancel := context.WithTimeout(cli.Ctx(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0 // 0: from the revision the member is at when the watch starts
	}
	return resp.Header.Revision
}

func (h *desiredHub) run(cli *clientv3.Client, prefix string, rev int64) {
	for cli.Ctx().Err() == nil {
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(cli.Ctx()))
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev+1))
		}
		for wr := range cli.Watch(ctx, prefix, opts...) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				h.wake(strings.TrimPrefix(string(ev.Kv.Key), prefix))
			}
		}
		cancel()
		// The watch ended (no leader, compaction, a member gone): every
		// waiter reads again, and the watch starts anew from now on.
		h.wakeAll()
		if !clock.SleepCtx(cli.Ctx(), 100*time.Millisecond) {
			return
		}
		rev = h.watch(cli, prefix)
	}
	h.wakeAll()
}

// wait returns a channel closed at host's next change.
func (h *desiredHub) wait(host string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.changed[host]
	if ch == nil {
		ch = make(chan struct{})
		h.changed[host] = ch
	}
	return ch
}

func (h *desiredHub) wake(host string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := h.changed[host]; ch != nil {
		close(ch)
		delete(h.changed, host)
	}
}

func (h *desiredHub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for host, ch := range h.changed {
		close(ch)
		delete(h.changed, host)
	}
}
