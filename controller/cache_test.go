package controller

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestPolicyDecodedOnce: the controller decodes the stored policy only
// when another writer changed it. Its own commits (an apply, a
// registration, a set, a migration that keeps the policy, a report) leave a cache
// that the next read uses; a commit that kept the policy used to leave a
// cache without the policy's revision, and every read after it decoded
// the policy again (about a second at 30,000 VMs).
func TestPolicyDecodedOnce(t *testing.T) {
	f := newFixture(t, true)
	decodes := func() float64 {
		var m dto.Metric
		if err := f.c.met.decodes.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	f.apply(readExample(t, "netioc-fig2.yaml"))
	if _, err := f.cl.VMs(f.ctx); err != nil {
		t.Fatal(err)
	}
	before := decodes()
	l, err := f.cl.Register(f.ctx, "h1", Report{VMs: []string{"vm1", "vm2", "vm3"}, Uplinks: []string{"vmnic0"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.VMs(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm1/nic0.shares=100"}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Migrate(f.ctx, "vm2", MigrateRequest{To: "h2", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Report(f.ctx, "h1", l.ID, Report{VMs: []string{"vm1", "vm2"}, Uplinks: []string{"vmnic0"}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := f.cl.VMs(f.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.cl.WatchDesired(f.ctx, "h1", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := decodes() - before; n != 0 {
		t.Errorf("the policy was decoded %v times after the controller's own commits, want 0", n)
	}
}
