package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestManyWatches: 300 agents long-poll their desired states at once; a
// set of one VM's vNIC returns its host's poll at once, with the new
// reservation, and no other poll returns. Every poll shares one etcd
// watch (desiredHub): with one watch per poll, their creations queue up
// in the etcd client and the changed host's poll could wait out its
// whole wait (docs/perf/controller.md).
func TestManyWatches(t *testing.T) {
	const hosts, vms = 300, 600
	c := New(Config{Client: testEtcd.Client, Prefix: testPrefix(t)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.Apply(ctx, ApplyRequest{File: "scale.yaml", Document: string(scalePolicy(hosts, vms))}); err != nil {
		t.Fatal(err)
	}
	type got struct {
		host string
		d    DesiredHost
		at   time.Time
	}
	returned := make(chan got, hosts)
	var wg sync.WaitGroup
	for h := 0; h < hosts; h++ {
		host := fmt.Sprintf("h%04d", h)
		d, err := c.WatchDesired(ctx, host, 0, 0)
		if err != nil || d.Revision == 0 {
			t.Fatalf("%s: %v %+v", host, err, d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd, err := c.WatchDesired(ctx, host, d.Revision, 20*time.Second)
			if err == nil && nd.Revision > d.Revision {
				returned <- got{host, nd, time.Now()}
			}
		}()
	}
	waiting := func() int {
		c.hub.mu.Lock()
		defer c.hub.mu.Unlock()
		return len(c.hub.changed)
	}
	for end := time.Now().Add(10 * time.Second); waiting() < hosts; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d polls waiting after 10 s", waiting(), hosts)
		}
	}
	start := time.Now()
	if _, err := c.Set(ctx, SetRequest{Changes: []string{"vm00300/nic0.reservation=200Mbps"}}); err != nil {
		t.Fatal(err)
	}
	setTook := time.Since(start)
	select {
	case g := <-returned:
		if g.host != "h0150" {
			t.Fatalf("the poll of %s returned, want h0150 (vm00300's host)", g.host)
		}
		if r := vnicR(g.d, "vm00300/nic0"); r != 200e6 {
			t.Fatalf("h0150's new desired state: vm00300/nic0 R=%g, want 2e8", r)
		}
		t.Logf("h0150's poll returned %v after the set began (the set took %v; %d polls waiting)", g.at.Sub(start).Round(time.Millisecond), setTook.Round(time.Millisecond), hosts)
		if took := g.at.Sub(start); took > 2*time.Second {
			t.Fatalf("h0150's poll returned %v after the set began, want ≤ 2 s", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no poll returned within 10 s of the set")
	}
	select {
	case g := <-returned:
		t.Fatalf("the poll of %s returned too, but its desired state did not change", g.host)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	wg.Wait()
}
