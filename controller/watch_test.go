package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sluice/policy"
)

// retryClock hands the test each wait of a Watch: AfterFunc sends its
// function on waits, and the wait ends when the test calls it.
type retryClock struct{ waits chan func() }

func (retryClock) Now() time.Time { return time.Time{} }

func (retryClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	panic("Watch uses no ticker")
}

func (c retryClock) AfterFunc(_ time.Duration, f func()) func() bool {
	c.waits <- f
	return func() bool { return true }
}

// watchAsk is one request of a Watch to the stand-in controller: the
// revision it asks for states after, and where the test puts the answer.
type watchAsk struct {
	after int64
	reply chan<- func(http.ResponseWriter)
}

// TestWatch drives a Watch step by step against a stand-in controller
// and a clock whose waits the test ends: each step is what the watch
// does next (a request, or a wait before a retry), what the test
// answers, and what the watch applied and logged since the last step.
func TestWatch(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte("cluster: t\nhosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	asks := make(chan watchAsk)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
		reply := make(chan func(http.ResponseWriter))
		select {
		case asks <- watchAsk{after, reply}:
		case <-r.Context().Done():
			return
		}
		select {
		case answer := <-reply:
			answer(w)
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()

	events := make(chan string, 100)
	var applyErr atomic.Value // string
	applyErr.Store("")
	clk := retryClock{waits: make(chan func())}
	w := &Watch{Client: &Client{Server: srv.URL, Token: testToken, HTTP: srv.Client()}, Host: "h1", From: 1,
		RetryEvery: time.Second, Wait: time.Minute, Clock: clk,
		Apply: func(d DesiredHost) error {
			events <- fmt.Sprintf("apply %d", d.Revision)
			if msg := applyErr.Load().(string); msg != "" {
				return errors.New(msg)
			}
			return nil
		},
		Log: func(level slog.Level, msg string) { events <- level.String() + " " + msg }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	steps := []struct {
		next  string // what the watch does: "ask N" (states after N) or "retry" (waits RetryEvery)
		apply string // Apply's error from this step on: "ok", a message, or "" (unchanged)
		reply string // the answer to an ask: "rev N", "rev N no-policy" or "status N"
		want  string // applied and logged since the last step, one per line
	}{
		{next: "ask 1", reply: "rev 2 no-policy"},
		{next: "retry", want: "WARN desired state 2 of h1 has no policy: keeping the last one (upgrade the controller)"},
		{next: "ask 2", apply: "disk pool busy", reply: "rev 3"},
		{next: "retry", want: "apply 3\nWARN applying desired state 3 of h1: disk pool busy"},
		// The same revision again, and the same error: not logged again.
		{next: "ask 2", reply: "rev 3"},
		{next: "retry", want: "apply 3"},
		{next: "ask 2", apply: "ok", reply: "rev 3"},
		{next: "ask 3", reply: "status 503", want: "apply 3"},
		{next: "retry", want: "WARN watching the desired state of h1: etcd unreachable"},
		// The long poll ends with the revision the watch has: asked again
		// at once.
		{next: "ask 3", reply: "rev 3"},
		{next: "ask 3", reply: "rev 4"},
		{next: "ask 4", want: "apply 4"},
	}
	for i, s := range steps {
		var ask watchAsk
		var fire func() // ends the watch's wait
		select {
		case ask = <-asks:
			if s.next != fmt.Sprintf("ask %d", ask.after) {
				t.Fatalf("step %d: the watch asks for states after %d, want %s", i, ask.after, s.next)
			}
		case fire = <-clk.waits:
			if s.next != "retry" {
				t.Fatalf("step %d: the watch waits to retry, want %s", i, s.next)
			}
		case <-time.After(stuckAfter):
			t.Fatalf("step %d: the watch did nothing within %v, want %s", i, stuckAfter, s.next)
		}
		var got []string
		for len(events) > 0 {
			got = append(got, <-events)
		}
		if g := strings.Join(got, "\n"); g != s.want {
			t.Errorf("step %d (%s): got\n%s\nwant\n%s", i, s.next, g, s.want)
		}
		switch s.apply {
		case "":
		case "ok":
			applyErr.Store("")
		default:
			applyErr.Store(s.apply)
		}
		var rev int64
		var status int
		switch {
		case s.reply == "":
		case strings.HasPrefix(s.reply, "status "):
			status, _ = strconv.Atoi(strings.TrimPrefix(s.reply, "status "))
			ask.reply <- func(w http.ResponseWriter) {
				w.WriteHeader(status)
				json.NewEncoder(w).Encode(ErrorBody{Error: "etcd unreachable"})
			}
		default:
			fmt.Sscanf(s.reply, "rev %d", &rev)
			d := DesiredHost{Host: "h1", Revision: rev, VMs: []string{}}
			if !strings.HasSuffix(s.reply, "no-policy") {
				d.Policy = p
			}
			ask.reply <- func(w http.ResponseWriter) { json.NewEncoder(w).Encode(d) }
		}
		if fire != nil {
			fire()
		}
	}
}
