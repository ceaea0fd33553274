package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// op2Token is a second operator's token (flow "operator 2").
const op2Token = "op2op2op2op2op2op2op2op2op2op2op"

// fairFixture is the API over plain HTTP with its priority levels sized
// by a test, a policy applied, and the tokens of two operators, h1 and
// h2. Its client waits for the server's 100 Continue before it sends a
// body, so that a request's body is read only once its handler runs:
// the test holds a seat by holding back a body.
type fairFixture struct {
	t       *testing.T
	s       *server
	url     string
	hc      *http.Client
	started chan *slow // each slow request once its handler reads its body
}

func newFairFixture(t *testing.T, fr Fairness) *fairFixture {
	t.Helper()
	c := New(Config{Client: testEtcd.Client, Prefix: testPrefix(t), HostTTLSeconds: 5})
	if _, err := c.Apply(context.Background(), ApplyRequest{Document: offDoc(t)}); err != nil {
		t.Fatal(err)
	}
	toks, err := ParseTokens([]byte(testToken + "\n" + op2Token + "\n" + h1Token + " host=h1\n" + h2Token + " host=h2\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, h := newHandler(c, toks, nil, fr)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr := &http.Transport{ExpectContinueTimeout: time.Minute, MaxIdleConnsPerHost: 100}
	t.Cleanup(tr.CloseIdleConnections)
	return &fairFixture{t: t, s: s, url: srv.URL, hc: &http.Client{Transport: tr, Timeout: time.Minute}, started: make(chan *slow, 100)}
}

// slow is a request whose body the test sends: its handler holds a seat
// from the moment it reads the body until the test finishes the body.
type slow struct {
	name string
	rest string
	pw   *io.PipeWriter
	done chan int // the status, -1 for an error
}

// slow sends a POST of body to path with tok; the request is reported on
// f.started when its handler starts reading the body.
func (f *fairFixture) slow(name, tok, path, body string) *slow {
	pr, pw := io.Pipe()
	req, err := http.NewRequest("POST", f.url+path, pr)
	if err != nil {
		f.t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Expect", "100-continue")
	req.Header.Set("Authorization", "Bearer "+tok)
	sl := &slow{name: name, rest: body[1:], pw: pw, done: make(chan int, 1)}
	go func() {
		resp, err := f.hc.Do(req)
		if err != nil {
			sl.done <- -1
			return
		}
		resp.Body.Close()
		sl.done <- resp.StatusCode
	}()
	go func() {
		// The client reads the body after the server's 100 Continue,
		// sent at the handler's first read.
		if _, err := pw.Write([]byte(body[:1])); err == nil {
			f.started <- sl
		}
	}()
	f.t.Cleanup(func() { pw.CloseWithError(errors.New("test over")) })
	return sl
}

// slowOp is an operator's slow request (a what-if); slowHost one of h1
// (a report).
func (f *fairFixture) slowOp(name, tok string) *slow {
	return f.slow(name, tok, "/v1/what-if", `{"changes":[]}`)
}

func (f *fairFixture) slowHost(name string) *slow {
	return f.slow(name, h1Token, "/v1/hosts/h1/report", `{"lease_id":1,"report":{"vms":[]}}`)
}

// finish sends the rest of the body and returns the status.
func (sl *slow) finish(t *testing.T) int {
	t.Helper()
	if _, err := io.WriteString(sl.pw, sl.rest); err != nil {
		t.Fatalf("%s: %v", sl.name, err)
	}
	sl.pw.Close()
	return <-sl.done
}

// nextStarted is the next slow request whose handler started.
func (f *fairFixture) nextStarted() *slow {
	f.t.Helper()
	select {
	case sl := <-f.started:
		return sl
	case <-time.After(10 * time.Second):
		f.t.Fatal("no slow request started within 10 s")
		return nil
	}
}

type answer struct {
	status int
	retry  string
	body   string
	err    error
}

// get sends GET path with tok.
func (f *fairFixture) get(ctx context.Context, tok, path string) answer {
	req, err := http.NewRequestWithContext(ctx, "GET", f.url+path, nil)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := f.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: string(b)}
}

// goGet is get in its own goroutine.
func (f *fairFixture) goGet(ctx context.Context, tok, path string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- f.get(ctx, tok, path) }()
	return ch
}

func recv(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s")
		return answer{}
	}
}

// levelWatch records the states of a level, so that a test waits for
// one.
type levelWatch struct {
	l      *level
	mu     sync.Mutex
	states []levelState // not yet looked at, oldest first
	now    levelState   // the last one
	more   chan struct{}
}

type levelState struct{ inUse, waiting int }

func watchLevel(l *level) *levelWatch {
	lw := &levelWatch{l: l, more: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	note := func() {
		lw.mu.Lock()
		lw.now = levelState{l.inUse, l.waiting}
		lw.states = append(lw.states, lw.now)
		lw.mu.Unlock()
		select {
		case lw.more <- struct{}{}:
		default:
		}
	}
	note()
	l.changed = note
	return lw
}

// until waits for the level to have inUse seats taken and waiting
// requests waiting: in a state after those already looked at, or now.
func (lw *levelWatch) until(t *testing.T, inUse, waiting int) {
	t.Helper()
	want := levelState{inUse, waiting}
	timeout := time.After(10 * time.Second)
	for {
		lw.mu.Lock()
		for len(lw.states) > 0 {
			st := lw.states[0]
			lw.states = lw.states[1:]
			if st == want {
				lw.mu.Unlock()
				return
			}
		}
		now := lw.now
		lw.mu.Unlock()
		if now == want {
			return
		}
		select {
		case <-lw.more:
		case <-timeout:
			t.Fatalf("level %s: %d seats in use and %d requests waiting, want %d and %d", lw.l.name, now.inUse, now.waiting, inUse, waiting)
		}
	}
}

// is fails the test unless the level has inUse seats taken and waiting
// requests waiting now.
func (lw *levelWatch) is(t *testing.T, inUse, waiting int) {
	t.Helper()
	lw.mu.Lock()
	now := lw.now
	lw.mu.Unlock()
	if now != (levelState{inUse, waiting}) {
		t.Errorf("level %s: %d seats in use and %d requests waiting, want %d and %d", lw.l.name, now.inUse, now.waiting, inUse, waiting)
	}
}

// TestOperatorFloodLeavesHostSeats: an operator's slow requests hold all
// the operators' seats and more wait; h1's agent registers, heartbeats
// and reads its desired state at once all the same. The other way
// round, h1 holding the hosts' seats does not hold an operator.
func TestOperatorFloodLeavesHostSeats(t *testing.T) {
	f := newFairFixture(t, Fairness{OperatorSeats: 2, HostSeats: 2})
	ops, hosts := watchLevel(f.s.operators), watchLevel(f.s.hosts)
	h1 := &Client{Server: f.url, Token: h1Token, HTTP: f.hc}
	ctx := context.Background()

	a, b := f.slowOp("a", testToken), f.slowOp("b", testToken)
	f.nextStarted()
	f.nextStarted()
	queued := f.goGet(ctx, testToken, "/v1/hosts")
	ops.until(t, 2, 1)
	lease, err := h1.Register(ctx, "h1", Report{VMs: []string{}})
	if err != nil {
		t.Fatalf("register while the operators' seats are taken: %v", err)
	}
	if err := h1.Heartbeat(ctx, "h1", lease.ID); err != nil {
		t.Fatalf("heartbeat while the operators' seats are taken: %v", err)
	}
	if _, err := h1.WatchDesired(ctx, "h1", 0, 0); err != nil {
		t.Fatalf("desired state while the operators' seats are taken: %v", err)
	}
	ops.is(t, 2, 1) // the operator still waits
	a.finish(t)
	b.finish(t)
	if ans := recv(t, queued); ans.status != http.StatusOK {
		t.Errorf("the operator's waiting request: %+v", ans)
	}
	ops.until(t, 0, 0)

	// The other way round.
	x, y := f.slowHost("x"), f.slowHost("y")
	f.nextStarted()
	f.nextStarted()
	hq := f.goGet(ctx, h1Token, "/v1/hosts/h1/desired?wait=0s")
	hosts.until(t, 2, 1)
	if ans := f.get(ctx, testToken, "/v1/vms"); ans.status != http.StatusOK {
		t.Fatalf("an operator while the hosts' seats are taken: %+v", ans)
	}
	hosts.is(t, 2, 1)
	x.finish(t)
	y.finish(t)
	if ans := recv(t, hq); ans.status != http.StatusOK {
		t.Errorf("h1's waiting request: %+v", ans)
	}
}

// TestOperatorsShareSeats: operator 1 holds both seats and has six more
// requests waiting when operator 2 sends six: the seats that come free
// go to the two in turn, four each of the next eight.
func TestOperatorsShareSeats(t *testing.T) {
	f := newFairFixture(t, Fairness{OperatorSeats: 2})
	ops := watchLevel(f.s.operators)
	var holders []*slow
	holders = append(holders, f.slowOp("1", testToken), f.slowOp("1", testToken))
	f.nextStarted()
	f.nextStarted()
	for i := range 6 {
		f.slowOp("1", testToken)
		ops.until(t, 2, i+1)
	}
	for i := range 6 {
		f.slowOp("2", op2Token)
		ops.until(t, 2, 7+i)
	}
	var order []string
	served := map[string]int{}
	for range 8 {
		holders[0].finish(t)
		next := f.nextStarted()
		holders = append(holders[1:], next)
		order = append(order, next.name)
		served[next.name]++
	}
	if served["1"] != 4 || served["2"] != 4 {
		t.Errorf("the 8 seats that came free went to operators %s: want 4 each, in turn", strings.Join(order, " "))
	}
	// The rest, in turn as they start.
	for range 4 {
		holders[0].finish(t)
		holders = append(holders[1:], f.nextStarted())
	}
	for _, h := range holders {
		h.finish(t)
	}
	ops.until(t, 0, 0)
}

// TestFlowQueueBounded: with the one seat taken and two requests of
// operator 1 waiting, its third gets 429 with Retry-After at once while
// operator 2's request waits in its own queue; a waiting request whose
// client gives up frees its place, and the requests waiting are served
// once the seat comes free.
func TestFlowQueueBounded(t *testing.T) {
	// Waits never time out here (the test clock's waits are not
	// called): a request leaves its queue when served or given up.
	f := newFairFixture(t, Fairness{OperatorSeats: 1, QueueLength: 2, Clock: retryClock{waits: make(chan func(), 10)}})
	ops := watchLevel(f.s.operators)
	ctx := context.Background()
	holder := f.slowOp("holder", testToken)
	f.nextStarted()
	quit, cancel := context.WithCancel(ctx)
	gone := f.goGet(quit, testToken, "/v1/hosts")
	ops.until(t, 1, 1)
	second := f.goGet(ctx, testToken, "/v1/hosts")
	ops.until(t, 1, 2)

	ans := f.get(ctx, testToken, "/v1/hosts")
	if ans.status != http.StatusTooManyRequests || ans.retry != "1" || !strings.Contains(ans.body, `"error": "the operators' 1 seats are taken and 2 requests of operator 1 wait already: retry in a second"`) {
		t.Errorf("a third request waiting: %d Retry-After %q %s", ans.status, ans.retry, ans.body)
	}
	other := f.goGet(ctx, op2Token, "/v1/hosts")
	ops.until(t, 1, 3)

	cancel()
	if ans := recv(t, gone); ans.err == nil {
		t.Errorf("the request given up: %+v", ans)
	}
	ops.until(t, 1, 2)
	third := f.goGet(ctx, testToken, "/v1/hosts")
	ops.until(t, 1, 3)

	holder.finish(t)
	for i, ch := range []<-chan answer{second, other, third} {
		if ans := recv(t, ch); ans.status != http.StatusOK {
			t.Errorf("waiting request %d: %+v", i, ans)
		}
	}
	ops.until(t, 0, 0)
	if n := counted(f.s.operators.full); n != 1 {
		t.Errorf("rejected for a full queue: %v, want 1", n)
	}
}

// TestQueueWaitBounded: a request that waits the whole bound for a seat
// gets 429 with Retry-After (the wait is timed by a test clock).
func TestQueueWaitBounded(t *testing.T) {
	clk := retryClock{waits: make(chan func(), 1)}
	f := newFairFixture(t, Fairness{OperatorSeats: 1, QueueWait: 7 * time.Second, Clock: clk})
	ops := watchLevel(f.s.operators)
	holder := f.slowOp("holder", testToken)
	f.nextStarted()
	waiting := f.goGet(context.Background(), testToken, "/v1/vms")
	ops.until(t, 1, 1)
	(<-clk.waits)() // 7 s pass
	ans := recv(t, waiting)
	if ans.status != http.StatusTooManyRequests || ans.retry != "1" || !strings.Contains(ans.body, `"error": "none of the operators' 1 seats came free within 7s: retry in a second"`) {
		t.Errorf("after the wait: %d Retry-After %q %s", ans.status, ans.retry, ans.body)
	}
	ops.until(t, 1, 0)
	holder.finish(t)
	ops.until(t, 0, 0)
	if n := counted(f.s.operators.waited); n != 1 {
		t.Errorf("rejected for the wait: %v, want 1", n)
	}
}

// TestLongPollGivesSeatBack: h1's long poll of its desired state takes
// the hosts' one seat for its read, gives it back while it waits, and
// h1's heartbeat is served meanwhile.
func TestLongPollGivesSeatBack(t *testing.T) {
	f := newFairFixture(t, Fairness{HostSeats: 1})
	hosts := watchLevel(f.s.hosts)
	h1 := &Client{Server: f.url, Token: h1Token, HTTP: f.hc}
	ctx := context.Background()
	// One request after the other: each takes the seat and gives it
	// back.
	lease, err := h1.Register(ctx, "h1", Report{VMs: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	hosts.until(t, 1, 0)
	hosts.until(t, 0, 0)
	d, err := h1.WatchDesired(ctx, "h1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	hosts.until(t, 1, 0)
	hosts.until(t, 0, 0)
	quit, cancel := context.WithCancel(ctx)
	poll := f.goGet(quit, h1Token, fmt.Sprintf("/v1/hosts/h1/desired?after=%d&wait=60s", d.Revision))
	hosts.until(t, 1, 0)
	hosts.until(t, 0, 0) // waiting for a change
	if err := h1.Heartbeat(ctx, "h1", lease.ID); err != nil {
		t.Fatalf("heartbeat during the long poll: %v", err)
	}
	select {
	case ans := <-poll:
		t.Fatalf("the long poll returned: %+v", ans)
	default:
	}
	cancel()
	recv(t, poll)
}

// counted is the value of counter c.
func counted(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
