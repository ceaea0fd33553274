// Package livelab holds what the live tests of a lab share: running the
// agent in the test's process, the expected entitlements, and the watch
// that samples, while flows run, whether each port's HTB class is
// backlogged and whether its receiver fell behind (the facts the tests
// judge each second by).
//
// It is test support: its functions take a testing.TB and fail the test on
// a broken harness.
package livelab

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sluice/agent"
	"sluice/alloc"
	"sluice/entitle"
	"sluice/lab"
	"sluice/policy"
)

// SampleEvery is how often Watch reads the classes.
const SampleEvery = 20 * time.Millisecond

// RunAgent starts the agent of host in this process (dynamic or static)
// for policy p with the lab's inventory, and returns it with a function
// that stops it (also called at cleanup and reporting a failed step). It
// returns after the first step installed the tree.
func RunAgent(t testing.TB, plan *lab.Plan, p *policy.Policy, host string, dynamic bool) (*agent.Agent, func()) {
	t.Helper()
	k, err := agent.NewNetlinkKernel(plan.Host(host).Name)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := plan.Inventory(host)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Policy: p, Host: host, Kernel: k, Inventory: inv, Dynamic: dynamic})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(agent.NowNs()); err != nil {
		t.Fatalf("agent first step: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var mu sync.Mutex
	var lastErr error
	go func() {
		defer close(done)
		_ = agent.Run(ctx, a, nil, agent.NowNs(), (100 * time.Millisecond).Nanoseconds(), func(_ agent.Stats, _ agent.Changes, err error) {
			if err != nil {
				mu.Lock()
				lastErr = err
				mu.Unlock()
			}
		})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			k.Close()
			mu.Lock()
			defer mu.Unlock()
			if lastErr != nil {
				t.Errorf("agent step failed: %v", lastErr)
			}
		})
	}
	t.Cleanup(stop)
	return a, stop
}

// WithUsable returns a copy of p whose uplinks have the measured usable
// rate.
func WithUsable(p *policy.Policy, usable float64) *policy.Policy {
	q := *p
	q.Hosts = append([]policy.Host(nil), p.Hosts...)
	for i := range q.Hosts {
		q.Hosts[i].Uplinks = append([]policy.Uplink(nil), q.Hosts[i].Uplinks...)
		for j := range q.Hosts[i].Uplinks {
			q.Hosts[i].Uplinks[j].Usable = policy.Bps(usable)
		}
	}
	return &q
}

// Entitlements computes alloc's entitlements (payload bits/s) of the
// ports of host's first uplink on capacity usable, given which ports and
// classes are active (unbounded demand); everything else is idle.
func Entitlements(p *policy.Policy, host string, usable float64, active ...string) map[string]float64 {
	u := entitle.Derive(p, entitle.Live{}).HostUplinks(host)[0]
	u.UsableBps = usable
	n := entitle.NewNet(&entitle.Desired{Uplinks: []entitle.UplinkSpec{u}})
	on := map[string]bool{}
	for _, a := range active {
		on[a] = true
	}
	for _, pt := range n.Ports {
		pt.Node.Demand = 0
		if on[pt.Name] {
			pt.Node.Demand = alloc.Inf
		}
	}
	n.Compute()
	out := map[string]float64{}
	for _, pt := range n.Ports {
		out[pt.Name] = pt.AllocBps()
	}
	return out
}

// Second is one second of a watch.
type Second struct {
	Samples int
	Busy    map[string]int // per port: samples in which its class had packets waiting
	// Unread is, per port, how many bytes its receiver in the fabric had
	// received and not yet read at the second's first sample.
	Unread map[string]uint32
}

// MinBacklogged is the share of a second's samples in which a class must
// have had packets waiting for the second to count: then the scheduler,
// not the sender, decided its rate.
const MinBacklogged = 0.95

// Backlogged tells whether every port's class had packets waiting in at
// least MinBacklogged of the samples of second b; a second the watch did
// not reach, or in which it got fewer than half its samples (the machine
// stood still), is not.
func Backlogged(secs []Second, b int, ports []string) bool {
	if b >= len(secs) || secs[b].Samples < int(time.Second/SampleEvery)/2 {
		return false
	}
	for _, p := range ports {
		if float64(secs[b].Busy[p]) < MinBacklogged*float64(secs[b].Samples) {
			return false
		}
	}
	return true
}

// Receiver says how a port's receiving socket is found in the fabric's
// TCP sockets: by its local port (ServerSide: the fabric runs the iperf3
// server, the VM sends) or by its peer's port (ClientSide: the fabric runs
// the client of a reversed iperf3 whose server is in the VM).
type Receiver int

// Where the receiver of a port's flow is.
const (
	ServerSide Receiver = iota
	ClientSide
)

// tcpEstablished is TCP_ESTABLISHED in sock_diag's state field.
const tcpEstablished = 1

// Watch samples, every SampleEvery until the returned function is
// called, whether the HTB class of each port on host's first uplink has
// packets waiting, and once a second how many bytes each port's receiver
// (the socket on the port's iperf3 port in the fabric, found as recv
// says) has not read.
func Watch(t testing.TB, plan *lab.Plan, p *policy.Policy, host string, ports []string, recv Receiver) func() []Second {
	t.Helper()
	inv, err := plan.Inventory(host)
	if err != nil {
		t.Fatal(err)
	}
	trees, err := agent.Build(entitle.Derive(p, entitle.Live{}).HostUplinks(host), inv)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[agent.Handle]string{}
	for _, n := range trees[0].Nodes {
		for _, port := range ports {
			if n.Name == port {
				ids[n.ID] = port
			}
		}
	}
	if len(ids) != len(ports) {
		t.Fatalf("watch: ports %v not all on %s's first uplink", ports, host)
	}
	k, err := agent.NewNetlinkKernel(plan.Host(host).Name)
	if err != nil {
		t.Fatal(err)
	}
	fabric := fabricDiag(t, plan)
	iperf := map[uint16]string{}
	for _, port := range ports {
		iperf[uint16(plan.NIC(port).IperfPort)] = port
	}
	var secs []Second
	var readErr error
	quit, done := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		defer k.Close()
		defer fabric.Close()
		tick := time.NewTicker(SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-tick.C:
				cs, err := k.Classes(trees[0].Dev)
				if err != nil {
					readErr = err
					return
				}
				for b := int(now.Sub(start) / time.Second); len(secs) <= b; {
					secs = append(secs, Second{Busy: map[string]int{}})
				}
				sec := &secs[len(secs)-1]
				sec.Samples++
				for _, c := range cs {
					if port, ok := ids[c.ID]; ok && c.Queued > 0 {
						sec.Busy[port]++
					}
				}
				if sec.Samples > 1 {
					continue // the receivers are read once a second, at its start
				}
				sec.Unread = map[string]uint32{}
				for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
					socks, err := fabric.SocketDiagTCP(fam)
					if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
						readErr = err
						return
					}
					for _, sk := range socks {
						key := sk.ID.SourcePort
						if recv == ClientSide {
							key = sk.ID.DestinationPort
						}
						if port, ok := iperf[key]; ok && sk.State == tcpEstablished {
							sec.Unread[port] += sk.RQueue
						}
					}
				}
			}
		}
	}()
	var once sync.Once
	stop := func() []Second {
		once.Do(func() { close(quit); <-done })
		if readErr != nil {
			t.Fatalf("watch: %v", readErr)
		}
		return secs
	}
	t.Cleanup(func() { stop() })
	return stop
}

// fabricDiag opens a sock_diag netlink handle in the lab's fabric
// namespace.
func fabricDiag(t testing.TB, plan *lab.Plan) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromName(plan.Fabric.Name)
	if err != nil {
		t.Fatalf("fabric namespace: %v", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
	if err != nil {
		t.Fatalf("sock_diag in the fabric: %v", err)
	}
	return h
}
