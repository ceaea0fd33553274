package controller

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"sluice/placement"
)

// keys counts the keys under dir of f's prefix.
func (f *fixture) keys(dir string) int64 {
	f.t.Helper()
	resp, err := testEtcd.Client.Get(f.ctx, f.c.key(dir), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Count
}

// get does an authenticated GET of path and returns the status and body.
func (f *fixture) get(path string) (int, []byte) {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// A reason longer than MaxReasonBytes is refused with 400 naming the
// field, and nothing is stored; one of MaxReasonBytes is taken.
func TestReasonBounded(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	long, huge := strings.Repeat("x", MaxReasonBytes+1), strings.Repeat("y", 19<<20)
	events := f.keys(dirEvents)
	calls := map[string]func(reason string) error{
		"apply": func(r string) error {
			_, err := f.cl.Apply(f.ctx, ApplyRequest{Document: readExample(t, "netioc-fig2.yaml"), Reason: r})
			return err
		},
		"set": func(r string) error {
			_, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm1/nic0.shares=60"}, Reason: r})
			return err
		},
		"set change": func(r string) error {
			_, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm1/nic0.shares=60" + r}})
			return err
		},
		"power-on": func(r string) error {
			_, err := f.cl.PowerOn(f.ctx, "vm1", PowerOnRequest{Reason: r})
			return err
		},
		"migrate": func(r string) error {
			_, err := f.cl.Migrate(f.ctx, "vm2", MigrateRequest{To: "h2", Reason: r})
			return err
		},
		"approve": func(r string) error { _, err := f.cl.Approve(f.ctx, 1, r); return err },
		"admit": func(r string) error {
			_, err := f.cl.Admit(f.ctx, "vm1", AdmitRequest{Host: "h1", Reason: r})
			return err
		},
	}
	for name, call := range calls {
		for _, r := range []string{long, huge} {
			err := call(r)
			want := "reason: "
			if name == "set change" {
				want = "changes[0]: "
			}
			if StatusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", MaxReasonBytes)) {
				t.Errorf("%s with a reason of %d bytes: %v, want 400 naming %q", name, len(r), err, want)
			}
		}
	}
	if n := f.keys(dirEvents); n != events {
		t.Errorf("refused requests stored events: %d, was %d", n, events)
	}
	r, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm1/nic0.shares=60"}, Reason: strings.Repeat("z", MaxReasonBytes)})
	if err != nil || len(r.Events) == 0 || len(r.Events[0].Reason) != MaxReasonBytes {
		t.Fatalf("a reason of %d bytes: %+v %v", MaxReasonBytes, r, err)
	}
}

// Each change keeps at most MaxEvents events: the oldest go in its
// transaction.
func TestEventsKeptByCount(t *testing.T) {
	f := newFixtureWith(t, Config{ChooseHosts: true, MaxEvents: 10})
	f.apply(readExample(t, "netioc-fig2.yaml"))
	for i := range 30 {
		if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("vm1/nic0.shares=%d", 10+i)}, Reason: strings.Repeat("r", MaxReasonBytes)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.keys(dirEvents); n > 10 {
		t.Errorf("%d events stored, want at most 10", n)
	}
	es, err := f.c.Events(f.ctx, 0, 0)
	if err != nil || len(es) != 10 || !strings.HasPrefix(es[len(es)-1].Message, "vm1/nic0.shares=39:") {
		t.Fatalf("%d events, want the 10 newest: %v", len(es), err)
	}
}

// A page of events is at most the limit (default DefaultPageLimit, at
// most MaxPageLimit) and about maxPageBytes; paging with after reads
// every event once.
func TestEventsPaged(t *testing.T) {
	f := newFixture(t, true)
	const n = 1200
	msg := strings.Repeat("m", maxEventText)
	var ops []clientv3.Op
	for i := 1; i <= n; i++ {
		b, _ := json.Marshal(Event{Seq: int64(i), Kind: "set", Subject: "vm1", Message: msg, Reason: strings.Repeat("r", MaxReasonBytes)})
		ops = append(ops, clientv3.OpPut(f.c.key(fmt.Sprintf("%s%020d", dirEvents, i)), string(b)))
		if len(ops) == 100 {
			if _, err := testEtcd.Client.Txn(f.ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = nil
		}
	}
	for _, path := range []string{"/v1/events", "/v1/events?limit=100000", "/v1/decisions?limit=100000"} {
		status, body := f.get(path)
		var es []Event
		if status != http.StatusOK || json.Unmarshal(body, &es) != nil {
			t.Fatalf("GET %s: %d %.200s", path, status, body)
		}
		if len(body) > 1<<20 || len(es) > DefaultPageLimit && path == "/v1/events" {
			t.Errorf("GET %s: %d events, %d bytes", path, len(es), len(body))
		}
	}
	if status, body := f.get("/v1/events?limit=-1"); status != http.StatusBadRequest || !strings.Contains(string(body), "limit") {
		t.Errorf("limit=-1: %d %s", status, body)
	}
	seen, after, pages := 0, int64(0), 0
	for ; pages < n; pages++ {
		status, body := f.get(fmt.Sprintf("/v1/events?after=%d&limit=%d", after, MaxPageLimit))
		var es []Event
		if status != http.StatusOK || json.Unmarshal(body, &es) != nil {
			t.Fatalf("page %d: %d", pages, status)
		}
		if len(body) > 1<<20 {
			t.Errorf("page %d: %d bytes", pages, len(body))
		}
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			if e.Seq != after+1 {
				t.Fatalf("page %d: event %d after %d", pages, e.Seq, after)
			}
			after = e.Seq
			seen++
		}
	}
	if seen != n || pages < 2 {
		t.Errorf("paging read %d events in %d pages, want %d", seen, pages, n)
	}
}

// Prune deletes the events older than the TTL and the decisions older
// than it that are not under way, then the oldest beyond MaxDecisions;
// pending and moving decisions stay.
func TestPrune(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	f := newFixtureWith(t, Config{ChooseHosts: true, EventTTL: time.Hour, MaxDecisions: 3, Now: func() time.Time { return now }})
	f.apply(readExample(t, "netioc-fig2.yaml"))
	old := f.keys(dirEvents)
	now = now.Add(2 * time.Hour)
	if _, err := f.cl.Set(f.ctx, SetRequest{Changes: []string{"vm1/nic0.shares=60"}}); err != nil {
		t.Fatal(err)
	}
	// The prune runs 30 minutes after the set, 2.5 h after the apply.
	now = now.Add(30 * time.Minute)
	put := func(seq int64, age time.Duration, status string) {
		b, _ := json.Marshal(Decision{Seq: seq, Time: now.Add(-age), VM: "vm1", From: "h1", To: "h2", Status: status})
		if _, err := testEtcd.Client.Put(f.ctx, f.c.key(fmt.Sprintf("%s%020d", dirDecisions, seq)), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put(101, 2*time.Hour, "done")    // past the TTL: goes
	put(102, 2*time.Hour, "moving")  // under way: stays
	put(103, 2*time.Hour, "pending") // asked: stays
	put(104, 30*time.Minute, "done") // beyond the count: go
	put(105, 20*time.Minute, "failed")
	put(106, 10*time.Minute, "superseded")
	put(107, 0, "recommended") // the newest: stays
	n, err := f.c.Prune(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	es, _ := f.c.Events(f.ctx, 0, 0)
	if len(es) != 1 || es[0].Kind != "set" {
		t.Errorf("events after the prune: %+v (there were %d old ones)", es, old)
	}
	ds, _ := f.c.Decisions(f.ctx, 0, 0)
	var got []string
	for _, d := range ds {
		got = append(got, fmt.Sprintf("%d:%s", d.Seq, d.Status))
	}
	// 101 is past the TTL; six remain, three beyond MaxDecisions: the
	// three oldest that are not under way go.
	if want := "102:moving 103:pending 107:recommended"; strings.Join(got, " ") != want {
		t.Errorf("decisions after the prune: %s, want %s", strings.Join(got, " "), want)
	}
	if want := int(old) + 4; n != want {
		t.Errorf("Prune deleted %d keys, want %d", n, want)
	}
	if n, err := f.c.Prune(f.ctx); n != 0 || err != nil {
		t.Errorf("a second prune: %d %v", n, err)
	}
}

// One change records at most maxFaultEvents fault events (the last sums
// up the others) and at most maxChangeEvents events; texts are clipped.
func TestFaultEventsBounded(t *testing.T) {
	var after []placement.Decision
	for i := range 1000 {
		after = append(after, placement.Decision{Host: fmt.Sprintf("h%04d", i), Why: "uplink eth0: reservations 12 Gbps > 9.4 Gbps"})
	}
	evs := newFaults(nil, after)
	if len(evs) != maxFaultEvents || !strings.HasPrefix(evs[maxFaultEvents-1].Message, "981 more faults on 981 hosts (h0019, h0020") {
		t.Fatalf("%d fault events, last %+v", len(evs), evs[len(evs)-1])
	}
	many := make([]Event, 1000)
	for i := range many {
		many[i] = Event{Kind: "observed", Subject: "vm", Message: strings.Repeat("é", maxEventText)}
	}
	got := boundEvents(many, nil)
	last := got[len(got)-1]
	if len(got) != maxChangeEvents || last.Kind != "more" || !strings.Contains(last.Message, "801 more events of this change not recorded (801 observed)") {
		t.Fatalf("%d events, last %+v", len(got), last)
	}
	if m := got[0].Message; len(m) > maxEventText || !strings.HasSuffix(m, "bytes cut)") || !strings.HasPrefix(m, "éé") || strings.ContainsRune(m, '\uFFFD') {
		t.Errorf("clipped message: %d bytes, ends %q", len(m), m[len(m)-30:])
	}
}

// TestBoundedEventsGroupCommit: decisions committed together (group
// commit) keep their own events, each capped at maxChangeEvents.
func TestBoundedEventsGroupCommit(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	var batch []*decideReq
	for _, n := range []int{150, 500, 150} {
		batch = append(batch, &decideReq{d: func(v view) (*next, error) {
			nx := v.from()
			for i := range n {
				nx.events = append(nx.events, Event{Kind: "observed", Subject: fmt.Sprint("vm", i), Message: "m", Reason: "r"})
			}
			return nx, nil
		}})
	}
	f.c.mu.Lock()
	f.c.decideBatch(f.ctx, batch)
	f.c.mu.Unlock()
	var got []string
	for _, r := range batch {
		if r.err != nil {
			t.Fatal(r.err)
		}
		last := r.res.Events[len(r.res.Events)-1]
		got = append(got, fmt.Sprintf("%d %s", len(r.res.Events), last.Kind))
	}
	if want := "150 observed, 200 more, 150 observed"; strings.Join(got, ", ") != want {
		t.Errorf("events per decision: %s, want %s", strings.Join(got, ", "), want)
	}
}
