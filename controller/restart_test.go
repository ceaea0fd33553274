package controller

import (
	"context"
	"testing"
)

// TestRestart makes changes, stops etcd and the controller, starts both on
// the same data directory and finds everything: policy, changes,
// placement, events, decisions, desired states.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := EtcdConfig{Dir: dir}
	e, err := OpenEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := New(Config{Client: e.Client, ChooseHosts: true})
	if _, err := c.Apply(ctx, ApplyRequest{File: "fig2.yaml", Document: offDoc(t)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, SetRequest{Changes: []string{"vm1/nic0.reservation=7Gbps", "vm2/nic0.limit=1Gbps"}, Reason: "restart test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PowerOn(ctx, "big", PowerOnRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx, "vm2", MigrateRequest{To: "h2"}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, c)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = OpenEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	t.Logf("restart of the embedded etcd: %v", e.StartTime)
	c = New(Config{Client: e.Client, ChooseHosts: true})
	if after := snapshot(t, c); after != before {
		t.Fatalf("after restart:\n%s\nbefore:\n%s", after, before)
	}
	// And it goes on numbering events where it was.
	r, err := c.Set(ctx, SetRequest{Changes: []string{"vm3/nic0.shares=high"}})
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := c.Events(ctx, 0, 0)
	if r.Events[0].Seq != evs[len(evs)-1].Seq || len(evs) < 5 || r.Revision != 3 {
		t.Fatalf("after restart: %+v, events %+v", r, evs)
	}
}

func snapshot(t *testing.T, c *Controller) string {
	t.Helper()
	ctx := context.Background()
	p, err := c.Policy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vs, _ := c.VMs(ctx)
	hs, _ := c.Hosts(ctx)
	es, _ := c.Events(ctx, 0, 0)
	ds, _ := c.Decisions(ctx, 0, 0)
	d1, _ := c.WatchDesired(ctx, "h1", 0, 0)
	d2, _ := c.WatchDesired(ctx, "h2", 0, 0)
	return jsonOf(p, vs, hs, es, ds, d1, d2)
}
