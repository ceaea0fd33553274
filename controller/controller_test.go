package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// One embedded etcd serves the package's tests; each test keeps its state
// under a prefix of its own.
var testEtcd *Etcd

func freePort(t interface{ Fatal(...any) }) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(probeEnv); spec != "" {
		os.Exit(etcdProbe(spec))
	}
	dir, err := os.MkdirTemp("", "sluice-controller-test-")
	if err != nil {
		panic(err)
	}
	testEtcd, err = OpenEtcd(EtcdConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(os.Stderr, "embedded etcd started in %v\n", testEtcd.StartTime.Round(time.Millisecond))
	code := m.Run()
	testEtcd.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

const testToken = "0123456789abcdef0123456789abcdef"

// The tokens of the agents of h1 and h2 (node authorization).
const (
	h1Token = "h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1"
	h2Token = "h2h2h2h2h2h2h2h2h2h2h2h2h2h2h2h2"
)

// fixture is a controller behind a TLS test server and a client of it.
type fixture struct {
	t   *testing.T
	c   *Controller
	srv *httptest.Server
	cl  *Client
	ctx context.Context
}

// prefixSeq numbers the controllers of one test binary.
var prefixSeq atomic.Int64

// testPrefix is a key prefix of its own for each controller a test makes:
// -count=N runs the same test names against the one embedded etcd.
func testPrefix(t *testing.T) string { return fmt.Sprintf("/test/%s/%d/", t.Name(), prefixSeq.Add(1)) }

func newFixture(t *testing.T, choose bool) *fixture {
	t.Helper()
	return newFixtureWith(t, Config{ChooseHosts: choose})
}

// newFixtureWith is newFixture with cfg (its client, prefix and host TTL
// set here).
func newFixtureWith(t *testing.T, cfg Config) *fixture {
	t.Helper()
	cfg.Client, cfg.Prefix, cfg.HostTTLSeconds = testEtcd.Client, testPrefix(t), 5
	c := New(cfg)
	toks, err := ParseTokens([]byte("# test\n" + testToken + "\n" + h1Token + " host=h1\n" + h2Token + " host=h2\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(Handler(c, toks, nil))
	t.Cleanup(srv.Close)
	return &fixture{t: t, c: c, srv: srv, cl: &Client{Server: srv.URL, Token: testToken, HTTP: srv.Client()}, ctx: context.Background()}
}

func jsonOf(vs ...any) string {
	b, err := json.MarshalIndent(vs, "", " ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

func readExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (f *fixture) apply(doc string) Result {
	f.t.Helper()
	r, err := f.cl.Apply(f.ctx, ApplyRequest{File: "fig2.yaml", Document: doc})
	if err != nil {
		f.t.Fatalf("apply: %v", err)
	}
	return r
}

func (f *fixture) vm(name string) VMInfo {
	f.t.Helper()
	vs, err := f.cl.VMs(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, v := range vs {
		if v.Name == name {
			return v
		}
	}
	f.t.Fatalf("no VM %s in %+v", name, vs)
	return VMInfo{}
}

// dump renders everything a client can read, to compare states.
func (f *fixture) dump() string {
	f.t.Helper()
	var b strings.Builder
	p, err := f.cl.Policy(f.ctx)
	fmt.Fprintf(&b, "policy %d %q %v %v\n", p.Revision, p.File, p.Changes, err)
	vs, _ := f.cl.VMs(f.ctx)
	js, _ := json.Marshal(vs)
	fmt.Fprintf(&b, "vms %s\n", js)
	hs, _ := f.cl.Hosts(f.ctx)
	for i := range hs {
		if hs[i].Report != nil {
			hs[i].Report.Time = time.Time{}
		}
	}
	fmt.Fprintf(&b, "hosts %+v\n", hs)
	es, _ := f.cl.Events(f.ctx, 0)
	fmt.Fprintf(&b, "events %+v\n", es)
	ds, _ := f.cl.Decisions(f.ctx)
	fmt.Fprintf(&b, "decisions %+v\n", ds)
	return b.String()
}

func TestApplySetGetEvents(t *testing.T) {
	f := newFixture(t, true)
	doc := readExample(t, "netioc-fig2.yaml")
	r := f.apply(doc)
	if r.Revision != 1 || len(r.Events) == 0 || r.Events[0].Kind != "apply" {
		t.Fatalf("apply: %+v", r)
	}
	// No agent reports h1 yet: nobody can tell whether vm1 runs, so it
	// holds its reservations (unknown).
	v := f.vm("vm1")
	if v.Host != "h1" || v.State != "unknown" || v.Observed != "" || len(v.NICs) != 1 || fmt.Sprintf("%.2f", v.NICs[0].AllocBps/1e9) != "8.13" {
		t.Fatalf("vm1 after apply: %+v", v)
	}
	// Step b of Fig. 2: vm2 reserves 4.5 Gbps; h1 cannot hold it: a fault,
	// and placement recommends moving vm2.
	r, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm2/nic0.reservation=4.5Gbps"}, Reason: "step b"})
	if err != nil {
		t.Fatal(err)
	}
	kinds := ""
	for _, e := range r.Events {
		kinds += e.Kind + " "
	}
	if r.Revision != 2 || kinds != "set fault recommend " || r.Events[0].Reason != "step b" {
		t.Fatalf("set: %s %+v", kinds, r)
	}
	ds, err := f.cl.Decisions(f.ctx)
	if err != nil || len(ds) != 1 || ds[0].VM != "vm2" || ds[0].To != "h2" || ds[0].Status != "recommended" {
		t.Fatalf("decisions: %+v %v", ds, err)
	}
	if v := f.vm("vm2"); v.NICs[0].ReservationBps != 4.5e9 {
		t.Fatalf("vm2: %+v", v)
	}
	p, err := f.cl.Policy(f.ctx)
	if err != nil || p.Revision != 2 || len(p.Changes) != 1 {
		t.Fatalf("policy: %+v %v", p, err)
	}
	// Shares, limit, disk-less IOPS and CPU go through the same grammar.
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm3/nic0.shares=high", "vm3/nic0.limit=2Gbps", "vm3.cpu.reservation=1000MHz"}}); err != nil {
		t.Fatal(err)
	}
	if v := f.vm("vm3"); v.NICs[0].Shares != 100 || v.NICs[0].LimitBps == nil || *v.NICs[0].LimitBps != 2e9 || v.CPUReservation != 1000 {
		t.Fatalf("vm3: %+v", v)
	}
	// Bad changes: 400 and nothing changed; R > L: 409, refused, recorded.
	before := f.dump()
	for _, ch := range []string{"vm9/nic0.reservation=1Gbps", "vm1/nic0.reservation=lots", "vm1/nic0.bogus=1", "vm1.host=h2", "nonsense"} {
		if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{ch}}); StatusOf(err) != http.StatusBadRequest {
			t.Errorf("set %s: %v, want 400", ch, err)
		}
	}
	if after := f.dump(); after != before {
		t.Errorf("a bad change changed the state:\n%s\n%s", before, after)
	}
	_, err = f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm3/nic0.reservation=3Gbps"}})
	if StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "> limit") {
		t.Fatalf("R > L: %v", err)
	}
	if after := f.dump(); after != before {
		t.Errorf("a refused change wrote:\n%s\n%s", before, after)
	}
	es, _ := f.cl.Events(f.ctx, 0)
	// Events after a number.
	tail, err := f.cl.Events(f.ctx, es[len(es)-2].Seq)
	if err != nil || len(tail) != 1 || tail[0].Seq != es[len(es)-1].Seq {
		t.Fatalf("events after: %+v %v", tail, err)
	}
	// Explain is package explain's: the network part, then vm1's CPU on h1.
	ex, err := f.cl.Explain(f.ctx, "vm1/nic0")
	if err != nil || len(ex.Lines) == 0 || !strings.HasPrefix(ex.Lines[0], "vm1/nic0 on host h1") ||
		!strings.HasPrefix(ex.Lines[len(ex.Lines)-1], "cpu: vm1 is entitled to 5200 MHz (vCPUs: 2 × 2600 MHz) of host h1's 16 × 2600 MHz") {
		t.Fatalf("explain: %+v %v", ex, err)
	}
	if _, err := f.cl.Explain(f.ctx, "vm1/nic9"); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("explain of no port: %v", err)
	}
}

func TestApplyInvalid(t *testing.T) {
	f := newFixture(t, true)
	_, err := f.cl.Apply(f.ctx, ApplyRequest{File: "bad.yaml", Document: "cluster: x\nhosts:\n  - name: h1\n    uplinks: [{name: u, speed: 10Qbps}]\n"})
	var e *Error
	if StatusOf(err) != http.StatusBadRequest || !errorAs(err, &e) || len(e.Body.Problems) == 0 || !strings.HasPrefix(e.Body.Problems[0], "bad.yaml:") {
		t.Fatalf("invalid policy: %v %+v", err, e)
	}
	if _, err := f.cl.Policy(f.ctx); StatusOf(err) != http.StatusConflict {
		t.Fatalf("policy after a refused apply: %v", err)
	}
	if es, _ := f.cl.Events(f.ctx, 0); len(es) != 0 {
		t.Fatalf("events: %+v", es)
	}
}

func errorAs(err error, e **Error) bool {
	x, ok := err.(*Error)
	*e = x
	return ok
}

// offDoc is Fig. 2 with vm3 off (no host) and an off VM that fits on h2 only.
func offDoc(t *testing.T) string {
	doc := readExample(t, "netioc-fig2.yaml")
	doc = strings.Replace(doc, "  - name: vm3\n    host: h1\n", "  - name: vm3\n", 1)
	return doc + `  - name: big
    cpu: {vcpus: 2}
    memory: 4GiB
    nics: [{name: nic0, portGroup: pg-big, reservation: 7Gbps}]
`
}

func TestPowerOn(t *testing.T) {
	f := newFixture(t, true)
	f.apply(offDoc(t))
	if v := f.vm("vm3"); v.State != "off" {
		t.Fatalf("vm3: %+v", v)
	}
	// big reserves 7 Gbps: h1 holds vm1's 7.5 of its 7.5, h2 has room.
	r, err := f.cl.PowerOn(f.ctx, "big", PowerOnRequest{})
	if err != nil || f.vm("big").Host != "h2" {
		t.Fatalf("power-on big: %+v %v", r, err)
	}
	// vm3 wants 0 reservation; placement puts it somewhere.
	if _, err := f.cl.PowerOn(f.ctx, "vm3", PowerOnRequest{}); err != nil || f.vm("vm3").Host == "" {
		t.Fatalf("power-on vm3: %v", err)
	}
	if _, err := f.cl.PowerOn(f.ctx, "vm3", PowerOnRequest{}); StatusOf(err) != http.StatusConflict {
		t.Fatalf("second power-on: %v", err)
	}
	if _, err := f.cl.PowerOn(f.ctx, "nope", PowerOnRequest{}); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("power-on of no VM: %v", err)
	}
	// The desired state of h2 now has big's vNIC.
	d, err := f.cl.WatchDesired(f.ctx, "h2", 0, 0)
	if err != nil || d.Revision == 0 || !strings.Contains(fmt.Sprint(d.UplinkSpecs()), "big/nic0") {
		t.Fatalf("desired h2: %+v %v", d, err)
	}
}

func TestPowerOnRefused(t *testing.T) {
	f := newFixture(t, true)
	doc := offDoc(t)
	// A second VM like big: only one fits on h2, none on h1.
	doc += "  - name: big2\n    cpu: {vcpus: 2}\n    memory: 4GiB\n    nics: [{name: nic0, portGroup: pg-big, reservation: 7.4Gbps}]\n"
	f.apply(doc)
	if _, err := f.cl.PowerOn(f.ctx, "big", PowerOnRequest{}); err != nil {
		t.Fatal(err)
	}
	before := f.dump()
	_, err := f.cl.PowerOn(f.ctx, "big2", PowerOnRequest{})
	var e *Error
	if StatusOf(err) != http.StatusConflict || !errorAs(err, &e) || !strings.Contains(e.Body.Error, "refused") {
		t.Fatalf("power-on big2: %v", err)
	}
	if f.vm("big2").State != "off" {
		t.Fatal("a refused VM runs")
	}
	// A refusal is the answer to the request: nothing is written.
	if after := f.dump(); after != before {
		t.Errorf("a refused power-on changed the state:\n%s\n%s", before, after)
	}
	// On a given host that cannot hold it: refused as well.
	if _, err := f.cl.PowerOn(f.ctx, "big2", PowerOnRequest{Host: "h1"}); StatusOf(err) != http.StatusConflict {
		t.Fatalf("power-on big2 on h1: %v", err)
	}
}

// TestNotModelled: a policy whose hosts give no cpu: or memory: is valid
// (they are not modelled), and the controller agrees: no fault on apply,
// and a VM with vCPUs, a CPU reservation and memory powers on.
func TestNotModelled(t *testing.T) {
	f := newFixture(t, true)
	r := f.apply(`cluster: nocpu
hosts:
  - {name: h1, uplinks: [{name: vmnic0, speed: 10Gbps}]}
  - {name: h2, uplinks: [{name: vmnic0, speed: 10Gbps}]}
vms:
  - {name: v1, host: h1, cpu: {vcpus: 4, reservationMHz: 2000}, memory: 8GiB, nics: [{name: nic0, reservation: 1Gbps}]}
  - {name: v2, cpu: {vcpus: 8, reservationMHz: 4000}, memory: 16GiB}
`)
	for _, e := range r.Events {
		if e.Kind == "fault" {
			t.Errorf("apply: %s: %s", e.Kind, e.Message)
		}
	}
	if _, err := f.cl.PowerOn(f.ctx, "v2", PowerOnRequest{}); err != nil || f.vm("v2").Host == "" {
		t.Fatalf("power-on v2: %v", err)
	}
	es, _ := f.cl.Events(f.ctx, 0)
	for _, e := range es {
		if e.Kind == "fault" || e.Kind == "refuse" {
			t.Errorf("event %s: %s", e.Kind, e.Message)
		}
	}
}

func TestPlacementOff(t *testing.T) {
	f := newFixture(t, false)
	f.apply(offDoc(t))
	if _, err := f.cl.PowerOn(f.ctx, "vm3", PowerOnRequest{}); StatusOf(err) != http.StatusBadRequest {
		t.Fatalf("power-on without host, placement off: %v", err)
	}
	if _, err := f.cl.PowerOn(f.ctx, "vm3", PowerOnRequest{Host: "h2"}); err != nil || f.vm("vm3").Host != "h2" {
		t.Fatalf("power-on on h2: %v", err)
	}
}

func TestMigrate(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	r, err := f.cl.Migrate(f.ctx, "vm2", MigrateRequest{To: "h2", Reason: "maintenance of h1"})
	if err != nil || r.Events[0].Kind != "migrate" || r.Events[0].Reason != "maintenance of h1" {
		t.Fatalf("migrate: %+v %v", r, err)
	}
	ds, _ := f.cl.Decisions(f.ctx)
	if len(ds) != 1 || ds[0].Status != "moving" || ds[0].From != "h1" || ds[0].To != "h2" {
		t.Fatalf("decisions %+v", ds)
	}
	// The placement changes at once: both hosts' desired states say so.
	if f.vm("vm2").Host != "h2" {
		t.Fatal("migrate did not move the VM's placement")
	}
	d1, _ := f.cl.WatchDesired(f.ctx, "h1", 0, 0)
	d2, _ := f.cl.WatchDesired(f.ctx, "h2", 0, 0)
	if jsonOf(d1.VMs, d2.VMs) != jsonOf([]string{"vm1", "vm3"}, []string{"vm2"}) {
		t.Fatalf("desired VMs: %v %v", d1.VMs, d2.VMs)
	}
	for _, tc := range []struct {
		vm, to string
		want   int
	}{{"vm2", "h2", 409}, {"vm2", "h9", 404}, {"vm9", "h2", 404}} {
		if _, err := f.cl.Migrate(f.ctx, tc.vm, MigrateRequest{To: tc.to}); StatusOf(err) != tc.want {
			t.Errorf("migrate %s to %s: %v, want %d", tc.vm, tc.to, err, tc.want)
		}
	}
	// vm1 (7.5 Gbps) does not fit on h2 beside vm3 with 7 Gbps: refused.
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm3/nic0.reservation=1Gbps"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Migrate(f.ctx, "vm3", MigrateRequest{To: "h2"}); err != nil {
		t.Fatal(err)
	}
}

// TestAgentSide registers a host, heartbeats, reports and watches its
// desired state through a change.
func TestAgentSide(t *testing.T) {
	f := newFixture(t, true)
	d, err := f.cl.WatchDesired(f.ctx, "h1", 0, 0)
	if err != nil || d.Revision != 0 {
		t.Fatalf("desired before any policy: %+v %v", d, err)
	}
	f.apply(readExample(t, "netioc-fig2.yaml"))
	l, err := f.cl.Register(f.ctx, "h1", Report{VMs: []string{"vm1", "vm2", "vm3"}, Uplinks: []string{"vmnic0"}})
	if err != nil || l.ID == 0 || l.TTLSeconds != 5 {
		t.Fatalf("register: %+v %v", l, err)
	}
	if _, err := f.cl.Register(f.ctx, "h7", Report{}); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("register of a host not in the policy: %v", err)
	}
	if err := f.cl.Heartbeat(f.ctx, "h1", l.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Heartbeat(f.ctx, "h1", l.ID+1); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("heartbeat with a wrong lease: %v", err)
	}
	if err := f.cl.Report(f.ctx, "h1", l.ID, Report{VMs: []string{"vm1"}, Uplinks: []string{"vmnic0"}, RatesBps: map[string]float64{"vm1/nic0": 8e9}}); err != nil {
		t.Fatal(err)
	}
	hs, err := f.cl.Hosts(f.ctx)
	if err != nil || len(hs) != 2 || !hs[0].Registered || hs[1].Registered || hs[0].Report.RatesBps["vm1/nic0"] != 8e9 || len(hs[0].VMs) != 3 {
		t.Fatalf("hosts: %+v %v", hs, err)
	}
	d, err = f.cl.WatchDesired(f.ctx, "h1", 0, time.Second)
	if err != nil || d.Revision == 0 || len(d.Uplinks) != 1 {
		t.Fatalf("desired h1: %+v %v", d, err)
	}
	// Nothing changes: the watch returns after its wait with the same revision.
	start := time.Now()
	same, err := f.cl.WatchDesired(f.ctx, "h1", d.Revision, 300*time.Millisecond)
	if err != nil || same.Revision != d.Revision || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("idle watch: %+v %v after %v", same.Revision, err, time.Since(start))
	}
	// A change to h1's VMs wakes the watch at once; one to h2 does not
	// change h1's revision.
	type res struct {
		d   DesiredHost
		err error
		at  time.Duration
	}
	ch := make(chan res, 1)
	go func() {
		s := time.Now()
		nd, err := f.cl.WatchDesired(f.ctx, "h1", d.Revision, 10*time.Second)
		ch <- res{nd, err, time.Since(s)}
	}()
	time.Sleep(100 * time.Millisecond)
	setAt := time.Now()
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm2/nic0.reservation=1Gbps"}}); err != nil {
		t.Fatal(err)
	}
	got := <-ch
	if got.err != nil || got.d.Revision <= d.Revision {
		t.Fatalf("watch: %+v %v", got.d, got.err)
	}
	t.Logf("watch woke %v after the set", time.Since(setAt).Round(time.Millisecond))
	found := false
	for _, u := range got.d.UplinkSpecs() {
		for _, c := range u.Classes {
			for _, v := range c.VNICs {
				if v.Port == "vm2/nic0" && v.ReservationBps == 1e9 && v.VM == "vm2" && v.NIC == "nic0" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatalf("desired after set: %+v", got.d)
	}
	if _, err := f.cl.WatchDesired(f.ctx, "h9", 0, 0); StatusOf(err) != http.StatusNotFound {
		t.Fatalf("desired of no host: %v", err)
	}
}
