package agent

import (
	"context"
	"testing"
	"time"

	"sluice/policy"
)

// fakeClock hands the agent ticks that the test sends.
type fakeClock struct{ ch chan time.Time }

func (c fakeClock) Now() time.Time { return time.Time{} }

func (c fakeClock) NewTicker(time.Duration) (<-chan time.Time, func()) { return c.ch, func() {} }

func (c fakeClock) AfterFunc(time.Duration, func()) func() bool { return func() bool { return true } }

// TestRunSteps drives Run with a fake clock: one step at start, one per
// tick, each reported with the time it was given; cancel ends it.
func TestRunSteps(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(`cluster: t
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
vms: [{name: vm1, host: h1, nics: [{name: nic0}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	k := NewFakeKernel("sl-up0", "sl-v0n0")
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: testInventory(p, "h1"), Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	clock := fakeClock{ch: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan Stats)
	done := make(chan error)
	go func() {
		done <- Run(ctx, a, clock, 1e9, 1e8, func(s Stats, _ Changes, err error) {
			if err != nil {
				t.Errorf("step: %v", err)
			}
			reports <- s
		})
	}()
	if s := <-reports; s.NowNs != 1e9 {
		t.Errorf("first step at %d, want 1e9", s.NowNs)
	}
	for _, now := range []int64{1.1e9, 1.2e9} {
		clock.ch <- time.Unix(0, now)
		if s := <-reports; s.NowNs != now {
			t.Errorf("step at %d reported %d", now, s.NowNs)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if ok, _, _ := k.RootHTB("sl-up0"); !ok {
		t.Error("Run did not install the tree")
	}
}
