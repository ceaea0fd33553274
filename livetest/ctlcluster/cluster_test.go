// Package ctlcluster runs the real `sluice controller` on an external etcd
// cluster of three real etcd processes (Debian's etcd-server, on
// 127.0.0.1) and kills one of them: the controller keeps working (`sluice
// ctl` set and get succeed, an agent's follower keeps watching and gets
// every change), and the member, brought back, rejoins (it catches up with
// what was written while it was down and serves as one of the quorum). It
// needs no root, only /usr/bin/etcd (scripts/deps.sh installs it).
package ctlcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"sluice/controller"
	"sluice/livetest/livelab"
)

var bin string // the sluice binary built for the tests

func TestMain(m *testing.M) {
	var err error
	if bin, err = livelab.SluiceBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// member is one etcd process of the cluster.
type member struct {
	name, dir       string
	client, peer    string // URLs
	initialCluster  string
	cmd             *exec.Cmd
	log             string
	id              uint64
	startedAt       time.Time
	readyAfterStart time.Duration
}

func (m *member) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command("etcd", "--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", m.initialCluster, "--initial-cluster-state", "new",
		"--initial-cluster-token", "sluice-ctlcluster", "--logger", "zap", "--log-outputs", m.log,
		// What the controller needs of an external cluster (docs/perf/controller.md).
		"--max-txn-ops", fmt.Sprint(controller.MaxTxnOps), "--max-request-bytes", fmt.Sprint(controller.MaxTxnBytes),
		"--auto-compaction-mode", "periodic", "--auto-compaction-retention", controller.AutoCompactionRetention)
	if err := cmd.Start(); err != nil {
		t.Fatalf("etcd: %v (scripts/deps.sh installs etcd-server)", err)
	}
	m.cmd, m.startedAt = cmd, time.Now()
}

// kill sends SIGKILL and reaps the process.
func (m *member) kill() {
	if m.cmd == nil || m.cmd.ProcessState != nil {
		return
	}
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// direct returns a client of this member alone.
func (m *member) direct(t *testing.T) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.client}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// status is the member's own view of itself, or an error.
func (m *member) status(t *testing.T, c *clientv3.Client) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Status(ctx, m.client)
}

func startCluster(t *testing.T) []*member {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatalf("etcd not found: %v (scripts/deps.sh installs Debian's etcd-server)", err)
	}
	base := t.TempDir()
	ms := make([]*member, 3)
	var ic []string
	for i := range ms {
		m := &member{name: fmt.Sprintf("m%d", i), dir: filepath.Join(base, fmt.Sprintf("m%d", i)),
			client: fmt.Sprintf("http://127.0.0.1:%d", livelab.FreePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", livelab.FreePort(t)),
			log: filepath.Join(base, fmt.Sprintf("m%d.log", i))}
		ms[i] = m
		ic = append(ic, m.name+"="+m.peer)
	}
	for _, m := range ms {
		m.initialCluster = strings.Join(ic, ",")
		m.start(t)
		t.Cleanup(m.kill)
	}
	// Ready: each member answers its status and the cluster has a leader.
	for _, m := range ms {
		c := m.direct(t)
		waitFor(t, 20*time.Second, m.name+" serving", func() bool {
			s, err := m.status(t, c)
			if err != nil || s.Leader == 0 {
				return false
			}
			m.id = s.Header.MemberId
			return true
		})
		m.readyAfterStart = time.Since(m.startedAt)
	}
	return ms
}

func leaderOf(t *testing.T, ms []*member) *member {
	t.Helper()
	for _, m := range ms {
		if m.cmd.ProcessState != nil {
			continue
		}
		if s, err := m.status(t, m.direct(t)); err == nil {
			for _, l := range ms {
				if l.id == s.Leader {
					return l
				}
			}
		}
	}
	t.Fatal("no member knows a leader")
	return nil
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, within)
	return 0
}

// startController starts `sluice controller` and waits for its ready
// line (livelab.StartController).
func startController(t *testing.T, dir string, args []string) *livelab.Controller {
	t.Helper()
	return livelab.StartController(t, bin, dir, args)
}

// ctl runs `sluice ctl` and returns its output; a non-zero exit fails the test.
func ctl(t *testing.T, conn []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{"ctl"}, conn...), args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sluice ctl %s: %v\nstdout %s\nstderr %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// agent is a simulated agent of h1: controller.Follower drives it through
// the real API (register, report, long-poll watch); it records vm1/nic0's
// reservation in every desired state it is handed.
type agent struct {
	mu   sync.Mutex
	seen []float64
	vms  []string
}

func (a *agent) Apply(d controller.DesiredHost) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.vms = d.VMs
	for _, u := range d.Uplinks {
		for _, c := range u.Classes {
			for _, v := range c.VNICs {
				if v.Port == "vm1/nic0" {
					a.seen = append(a.seen, v.ReservationBps)
				}
			}
		}
	}
	return nil
}

func (a *agent) Report() controller.Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return controller.Report{VMs: slices.Clone(a.vms), Uplinks: []string{"vmnic0"}}
}

func (a *agent) last() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) == 0 {
		return -1
	}
	return a.seen[len(a.seen)-1]
}

// setAndSee makes vm1/nic0's reservation bps with `sluice ctl set` and
// waits for the agent to be handed it; it returns how long the set took and
// how long from its start to the agent having it.
func setAndSee(t *testing.T, conn []string, a *agent, bps float64, reason string) (time.Duration, time.Duration) {
	t.Helper()
	start := time.Now()
	out := ctl(t, conn, "set", "vm1/nic0", fmt.Sprintf("reservation=%gGbps", bps/1e9), "--reason", reason)
	took := time.Since(start)
	if !strings.Contains(out, "vm1/nic0 gets") {
		t.Fatalf("set: %s", out)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("the agent of h1 handed vm1/nic0 R=%g", bps), func() bool { return a.last() == bps })
	return took, time.Since(start)
}

// vmReservation reads vm1/nic0's reservation from `sluice ctl get vms -o json`.
func vmReservation(t *testing.T, conn []string) float64 {
	t.Helper()
	var vms []controller.VMInfo
	if err := json.Unmarshal([]byte(ctl(t, conn, "get", "vms", "-o", "json")), &vms); err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if v.Name == "vm1" {
			return v.NICs[0].ReservationBps
		}
	}
	t.Fatal("get vms: no vm1")
	return 0
}

// TestThreeMembersOneKilled: the controller on three etcd members; the
// leader is killed (kill -9): ctl and the agent keep working on the two
// left; the member is started again on its data directory and catches up;
// then another member is killed, so that the quorum needs the one that
// came back, and everything still works, also after the controller itself
// is killed and started again with that member down.
func TestThreeMembersOneKilled(t *testing.T) {
	t0 := time.Now()
	ms := startCluster(t)
	for _, m := range ms {
		t.Logf("etcd %s %s (peer %s) ready %v after its start", m.name, m.client, m.peer, m.readyAfterStart.Round(time.Millisecond))
	}
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	dir := filepath.Join(t.TempDir(), "data")
	port := livelab.FreePort(t)
	ctlArgs := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--etcd-endpoints", strings.Join(eps, ","),
		"--prefix", "/ctlcluster/", "--host-ttl", "3", "--drs-interval", "0"}
	ctrl := startController(t, dir, ctlArgs)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	conn := []string{"--server", server, "--data-dir", dir}
	ctl(t, conn, "apply", "-f", "../../examples/netioc-fig2.yaml")

	token, err := controller.ReadToken(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := controller.NewClient(server, token, filepath.Join(dir, "tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	// fig2's VMs run on h1 from the start, as a hypervisor's would: the
	// agent reports them at its registration, before its first desired
	// state.
	a := &agent{vms: []string{"vm1", "vm2", "vm3"}}
	f := &controller.Follower{Client: cl, Host: "h1", Agent: a, RetryEvery: 200 * time.Millisecond, Wait: 5 * time.Second, Logf: t.Logf}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitFor(t, 10*time.Second, "the agent of h1 handed its first desired state", func() bool { return a.last() == 7.5e9 })
	took, seen := setAndSee(t, conn, a, 7e9, "three members up")
	t.Logf("three members: ctl set %v, agent handed the new reservation %v after the set began", took.Round(time.Millisecond), seen.Round(time.Millisecond))

	// Kill the leader: the harder case (an election).
	killed := leaderOf(t, ms)
	killed.kill()
	t.Logf("killed the leader %s (kill -9)", killed.name)
	took, seen = setAndSee(t, conn, a, 5e9, "leader killed")
	t.Logf("two members: ctl set %v, agent handed the new reservation %v after the set began", took.Round(time.Millisecond), seen.Round(time.Millisecond))
	if got := vmReservation(t, conn); got != 5e9 {
		t.Fatalf("get vms with %s down: vm1/nic0 reservation %g, want 5e9", killed.name, got)
	}
	if out := ctl(t, conn, "get", "events"); !strings.Contains(out, "leader killed") {
		t.Fatalf("get events with %s down: no event of the set:\n%s", killed.name, out)
	}
	// The agent's lease (3 s) lives on through keep-alives on the members left.
	waitFor(t, 10*time.Second, "h1 registered with a member down", func() bool {
		var hs []controller.HostInfo
		if json.Unmarshal([]byte(ctl(t, conn, "get", "hosts", "-o", "json")), &hs) != nil {
			return false
		}
		for _, h := range hs {
			if h.Name == "h1" {
				return h.Registered
			}
		}
		return false
	})

	// Back on its data directory: it rejoins and catches up.
	back := time.Now()
	killed.start(t)
	c := killed.direct(t)
	others := ms[:0:0]
	for _, m := range ms {
		if m != killed {
			others = append(others, m)
		}
	}
	caught := waitFor(t, 20*time.Second, killed.name+" caught up", func() bool {
		s, err := killed.status(t, c)
		if err != nil || s.Leader == 0 || len(s.Errors) > 0 {
			return false
		}
		ref, err := others[0].status(t, others[0].direct(t))
		if err != nil || s.RaftIndex < ref.RaftIndex {
			return false
		}
		// What was written while it was down, read from it alone.
		gctx, gcancel := context.WithTimeout(context.Background(), time.Second)
		defer gcancel()
		r, err := c.Get(gctx, "/ctlcluster/state/policy", clientv3.WithSerializable())
		return err == nil && len(r.Kvs) == 1 && strings.Contains(string(r.Kvs[0].Value), "vm1/nic0.reservation=5Gbps")
	})
	t.Logf("%s restarted: serving and caught up %v after its start", killed.name, caught.Round(time.Millisecond))
	mctx, mcancel := context.WithTimeout(context.Background(), 2*time.Second)
	ml, err := c.MemberList(mctx)
	mcancel()
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("member list from %s: %v %v", killed.name, ml, err)
	}
	for _, mm := range ml.Members {
		if mm.Name == "" || mm.IsLearner {
			t.Fatalf("member %x not a started voting member: %+v", mm.ID, mm)
		}
	}

	// Kill another member: the quorum is now the one that came back and the last one.
	second := others[0]
	second.kill()
	t.Logf("killed %s: the quorum needs %s, %v after its restart", second.name, killed.name, time.Since(back).Round(time.Millisecond))
	took, seen = setAndSee(t, conn, a, 6e9, "another member killed")
	t.Logf("two members (one of them back): ctl set %v, agent handed the new reservation %v after the set began", took.Round(time.Millisecond), seen.Round(time.Millisecond))
	if got := vmReservation(t, conn); got != 6e9 {
		t.Fatalf("get vms: vm1/nic0 reservation %g, want 6e9", got)
	}

	// The controller itself killed and started while a member is down:
	// it finds the two left among its three endpoints, and the agent's
	// follower reconnects and gets the next change.
	ctrl.Kill()
	restart := time.Now()
	startController(t, dir, ctlArgs)
	t.Logf("controller restarted with %s down: ready in %v", second.name, time.Since(restart).Round(time.Millisecond))
	if got := vmReservation(t, conn); got != 6e9 {
		t.Fatalf("get vms after the controller's restart: vm1/nic0 reservation %g, want 6e9", got)
	}
	took, seen = setAndSee(t, conn, a, 5.5e9, "controller restarted, a member down")
	t.Logf("controller restarted, two members: ctl set %v, agent handed the new reservation %v after the set began", took.Round(time.Millisecond), seen.Round(time.Millisecond))
	t.Logf("whole test %v", time.Since(t0).Round(time.Millisecond))
}
