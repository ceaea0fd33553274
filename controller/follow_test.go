package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/policy"
)

// fakeAgent records what the follower hands it.
type fakeAgent struct {
	mu      sync.Mutex
	applied []DesiredHost
	policy  *policy.Policy
	vms     []string
	fail    error
}

func (a *fakeAgent) Apply(d DesiredHost) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	a.applied, a.policy, a.vms = append(a.applied, d), d.Policy, d.VMs
	return nil
}

func (a *fakeAgent) Report() Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Report{VMs: slices.Clone(a.vms), Uplinks: []string{"vmnic0"}, RatesBps: map[string]float64{"vm1/nic0": 1e9}}
}

// reservation is vm1/nic0's reservation in the agent's policy.
func (a *fakeAgent) reservation() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.policy == nil {
		return -1
	}
	return float64(a.policy.VM("vm1").NICs[0].Reservation)
}

// stuckAfter bounds waitFor: a follower that has not taken a change by
// then is stuck. How fast it takes one is not these tests' verdict (they
// run beside every other package on a loaded machine): the live
// TestClusterAsItIs and bench/controller.sh measure that.
const stuckAfter = 20 * time.Second

// waitFor polls ok until it holds and returns how long that took; after
// stuckAfter the test fails.
func waitFor(t *testing.T, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < stuckAfter {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, stuckAfter)
	return 0
}

// TestFollower: the agent registers, gets the policy, takes a set within
// 1 s and reports; with the API gone it keeps what it has; when the API
// comes back on the same address it takes the changes made meanwhile.
func TestFollower(t *testing.T) {
	f := newDRSFixture(t, DRSAutomatic, 1)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	toks, _ := ParseTokens([]byte(testToken + "\n"))
	serve := func(l net.Listener) *httptest.Server {
		s := httptest.NewUnstartedServer(Handler(f.c, toks, nil))
		s.Listener.Close()
		s.Listener = l
		s.StartTLS()
		return s
	}
	srv := serve(l)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	cl := &Client{Server: "https://" + addr, Token: testToken, HTTP: &http.Client{Transport: tr}}
	ag := &fakeAgent{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		(&Follower{Client: cl, Host: "h1", Agent: ag, RetryEvery: 50 * time.Millisecond, Wait: time.Second, Logf: t.Logf}).Run(ctx)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "first policy", func() bool { return ag.reservation() == 7.5e9 })
	waitFor(t, "registration", func() bool {
		hs, _ := f.cl.Hosts(f.ctx)
		return hs[0].Registered && hs[0].Report != nil && hs[0].Report.RatesBps["vm1/nic0"] == 1e9
	})
	f.set("vm1/nic0.reservation=7Gbps")
	took := waitFor(t, "set taken", func() bool { return ag.reservation() == 7e9 })
	t.Logf("ctl set to the agent's policy: %v", took)

	// The API goes away: the agent keeps its policy.
	srv.Close()
	f.set("vm1/nic0.reservation=6Gbps")
	time.Sleep(300 * time.Millisecond)
	if ag.reservation() != 7e9 {
		t.Fatalf("without the API the agent's policy changed to %v", ag.reservation())
	}
	// Back on the same address: the change made meanwhile arrives.
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv = serve(l2)
	defer srv.Close()
	waitFor(t, "change after reconnect", func() bool { return ag.reservation() == 6e9 })

	// Step b moves vm2 to h2: h1's desired VMs lose it.
	f.set("vm2/nic0.reservation=4.5Gbps")
	waitFor(t, "vm2 leaves h1", func() bool {
		ag.mu.Lock()
		defer ag.mu.Unlock()
		return slices.Equal(ag.vms, []string{"vm1", "vm3"})
	})
}

// TestFollowerRetriesApply: an Apply that fails is tried again with the
// same desired state until it succeeds.
func TestFollowerRetriesApply(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	ag := &fakeAgent{fail: context.DeadlineExceeded}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		(&Follower{Client: f.cl, Host: "h1", Agent: ag, RetryEvery: 20 * time.Millisecond, Wait: time.Second}).Run(ctx)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond)
	ag.mu.Lock()
	ag.fail = nil
	ag.mu.Unlock()
	waitFor(t, "apply after failures", func() bool { return ag.reservation() == 7.5e9 })
}

// TestFollowerReportsArrival: when a VM migrates to the follower's host,
// the host reports it as soon as the agent took it, not at its next
// periodic report, so the migration's decision is done at once.
func TestFollowerReportsArrival(t *testing.T) {
	f := newDRSFixture(t, DRSAutomatic, 1)
	f.c.cfg.HostTTLSeconds = 30 // periodic reports every 10 s
	f.apply(readExample(t, "netioc-fig2.yaml"))
	ag := &fakeAgent{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		(&Follower{Client: f.cl, Host: "h2", Agent: ag, RetryEvery: 50 * time.Millisecond, Wait: time.Second}).Run(ctx)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "registration", func() bool {
		hs, _ := f.cl.Hosts(f.ctx)
		return hs[1].Registered
	})
	f.set("vm1/nic0.reservation=7.5Gbps")
	f.set("vm2/nic0.reservation=4.5Gbps") // vm2 moves to h2
	took := waitFor(t, "vm2's migration done", func() bool {
		ds, _ := f.cl.Decisions(f.ctx)
		return len(ds) == 1 && ds[0].Status == "done"
	})
	t.Logf("set to the migration done (the destination's report): %v", took)
	if periodic := time.Duration(f.c.cfg.HostTTLSeconds) * time.Second / 3; took >= periodic {
		t.Errorf("the migration was done after %v, not before the periodic report (every %v)", took, periodic)
	}
}

// TestFollowerRefusedToken: an agent with another host's token is told
// that the controller refuses its token (not that it is unreachable).
func TestFollowerRefusedToken(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	cl := &Client{Server: f.cl.Server, Token: h2Token, HTTP: f.cl.HTTP}
	lines := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&Follower{Client: cl, Host: "h1", Agent: &fakeAgent{}, RetryEvery: 20 * time.Millisecond, Wait: 100 * time.Millisecond,
			Logf: func(format string, args ...any) {
				select {
				case lines <- fmt.Sprintf(format, args...):
				default:
				}
			}}).Run(ctx)
	}()
	for l := range lines {
		if strings.Contains(l, "registered") {
			t.Fatalf("registered with h2's token: %s", l)
		}
		if strings.HasPrefix(l, "controller refused this token (this token acts as host h2") {
			break
		}
		if strings.HasPrefix(l, "controller unreachable") {
			t.Fatalf("a refused token logged as %q", l)
		}
	}
	cancel()
	<-done
}
