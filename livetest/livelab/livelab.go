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
	"sort"
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
	return entitlementsOf(&entitle.Desired{Uplinks: []entitle.UplinkSpec{u}}, false, active)
}

// entitlementsOf computes the entitlements of d's trees (its inbound ones
// with inbound) with unbounded demand for the active ports.
func entitlementsOf(d *entitle.Desired, inbound bool, active []string) map[string]float64 {
	n := entitle.NewNet(d)
	if inbound {
		n = entitle.NewInboundNet(d)
	}
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
	if b < 0 || b >= len(secs) || secs[b].Samples < int(time.Second/SampleEvery)/2 {
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

// ClassWatch samples, every SampleEvery until stopped, whether the HTB
// class of each of a host's ports has packets waiting.
type ClassWatch struct {
	t       testing.TB
	start   time.Time
	speed   agent.WireBps // the line rate of the watched tree's root
	mu      sync.Mutex
	secs    []Second
	sent    []classSample // what each port's class had sent, per sample
	readErr error
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// Watch starts a ClassWatch of the ports of host's first uplink; cleanup
// stops it.
func Watch(t testing.TB, plan *lab.Plan, p *policy.Policy, host string, ports []string) *ClassWatch {
	t.Helper()
	inv, err := plan.Inventory(host)
	if err != nil {
		t.Fatal(err)
	}
	trees, err := agent.Build(entitle.Derive(p, entitle.Live{}).HostUplinks(host), inv)
	if err != nil {
		t.Fatal(err)
	}
	return watchTree(t, plan, host, trees, ports)
}

// watchTree starts a ClassWatch of the ports of trees[0] of host.
func watchTree(t testing.TB, plan *lab.Plan, host string, trees []*agent.Tree, ports []string) *ClassWatch {
	t.Helper()
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
	w := &ClassWatch{t: t, start: time.Now(), speed: trees[0].SpeedBps, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer k.Close()
		tick := time.NewTicker(SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
				cs, err := k.Classes(trees[0].Dev)
				// The counters' time is when the kernel answered, not when
				// the tick was due: a late tick would shift them.
				now := time.Now()
				w.mu.Lock()
				if err != nil {
					w.readErr = err
					w.mu.Unlock()
					return
				}
				for b := int(now.Sub(w.start) / time.Second); len(w.secs) <= b; {
					w.secs = append(w.secs, Second{Busy: map[string]int{}})
				}
				sec := &w.secs[len(w.secs)-1]
				sec.Samples++
				cur := classSample{at: now, bytes: map[string]uint64{}, busy: map[string]bool{}}
				for _, c := range cs {
					port, ok := ids[c.ID]
					if !ok {
						continue
					}
					if c.Queued > 0 {
						sec.Busy[port]++
						cur.busy[port] = true
					}
					cur.bytes[port] = c.Bytes
				}
				w.sent = append(w.sent, cur)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop() })
	return w
}

// classSample is what each port's class had sent (bytes) at one sample,
// and whether it had packets waiting.
type classSample struct {
	at    time.Time
	bytes map[string]uint64
	busy  map[string]bool
}

// BackloggedBetween tells whether every port's class had packets waiting
// in at least MinBacklogged of the samples from a to b; a span in which
// the watch got fewer than half its samples (the machine stood still) is
// not.
func (w *ClassWatch) BackloggedBetween(ports []string, a, b time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.sent), func(i int) bool { return !w.sent[i].at.Before(a) })
	n := 0
	busy := map[string]int{}
	for k := i; k < len(w.sent) && !w.sent[k].at.After(b); k++ {
		n++
		for _, p := range ports {
			if w.sent[k].busy[p] {
				busy[p]++
			}
		}
	}
	if n == 0 || float64(n) < b.Sub(a).Seconds()*float64(time.Second/SampleEvery)/2 {
		return false
	}
	for _, p := range ports {
		if float64(busy[p]) < MinBacklogged*float64(n) {
			return false
		}
	}
	return true
}

// Sent is how many bytes port's class sent between the samples nearest
// to a and b (false when the watch has no samples there, or the class was
// made again in between: its counter went back).
func (w *ClassWatch) Sent(port string, a, b time.Time) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.sent), func(i int) bool { return !w.sent[i].at.Before(a) })
	j := sort.Search(len(w.sent), func(i int) bool { return !w.sent[i].at.Before(b) })
	return w.sentBetween(port, i, j)
}

// SentIn is what port's class sent from a to b: its counter interpolated
// linearly at a and at b between the samples around each (20 ms apart,
// in which a backlogged class sends at a steady rate). False when the
// watch has no samples around a or b, or the class was made again in
// between.
func (w *ClassWatch) SentIn(port string, a, b time.Time) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := func(t time.Time) (float64, int, bool) {
		j := sort.Search(len(w.sent), func(i int) bool { return !w.sent[i].at.Before(t) })
		if j == 0 || j >= len(w.sent) {
			return 0, 0, false
		}
		p, q := w.sent[j-1], w.sent[j]
		if q.bytes[port] < p.bytes[port] {
			return 0, 0, false
		}
		f := float64(t.Sub(p.at)) / float64(q.at.Sub(p.at))
		return float64(p.bytes[port]) + f*(float64(q.bytes[port])-float64(p.bytes[port])), j, true
	}
	x, i, ok1 := at(a)
	y, j, ok2 := at(b)
	if !ok1 || !ok2 || b.Before(a) {
		return 0, false
	}
	if _, ok := w.sentBetween(port, i-1, j); !ok {
		return 0, false
	}
	return y - x, true
}

// sentBetween is what port's class sent from sample i to sample j.
func (w *ClassWatch) sentBetween(port string, i, j int) (float64, bool) {
	if i < 0 || j >= len(w.sent) || j <= i {
		return 0, false
	}
	for k := i + 1; k <= j; k++ {
		if w.sent[k].bytes[port] < w.sent[k-1].bytes[port] {
			return 0, false
		}
	}
	return float64(w.sent[j].bytes[port]) - float64(w.sent[i].bytes[port]), true
}

// MaxInFlight bounds the bytes that can have left a class before a class
// sample and reach its receiver in order after it: the veth pair and the
// bridge between hold a few GSO packets of at most 64 KiB.
const MaxInFlight = 256 << 10

// Start is when the watch's second 0 began.
func (w *ClassWatch) Start() time.Time { return w.start }

// Stop ends the watch (idempotent) and returns its seconds.
func (w *ClassWatch) Stop() []Second {
	w.once.Do(func() { close(w.quit); <-w.done })
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readErr != nil {
		w.t.Fatalf("watch: %v", w.readErr)
	}
	return w.secs
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
