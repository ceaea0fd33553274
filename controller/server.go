package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits on request bodies, so that no client can make the controller
// hold more than a bounded amount of memory for them (docs/controller.md,
// Security).
const (
	// maxBody bounds a request body: a policy document of
	// policy.MaxFileBytes escaped in JSON. A body that declares more
	// (Content-Length) gets 413 unread; one that sends more gets 413 when
	// the reading reaches it.
	maxBody = 20 << 20
	// largeBody is the size from which a body draws on the budget while it
	// is read and decoded: a body that declares more, or that declares no
	// length (chunked), which counts as maxBody. Smaller bodies (agents'
	// heartbeats and reports, sets, power-ons) do not wait for it.
	largeBody = 1 << 20
	// bodyBudget is how many bytes of large bodies are read at once: two
	// of maxBody. (Decoding a JSON body of known length holds up to about
	// twice its size; one of unknown length is spooled first, see spool.)
	bodyBudget = 2 * maxBody
	// budgetWait is how long a large request waits for the budget before
	// it gets 503 with Retry-After.
	budgetWait = 2 * time.Second
)

// Handler returns the API (api/openapi.yaml) of c. Every request needs a
// bearer token of tokens: without a valid one it gets 401 before any route
// is looked at, so nothing changes; a host's token gets 403 outside its
// host's routes. Requests are served in the seats of the priority levels
// of fairness.go, with their defaults. errLog gets the internal errors
// (nil: discarded).
func Handler(c *Controller, tokens *Tokens, errLog *log.Logger) http.Handler {
	_, h := newHandler(c, tokens, errLog, Fairness{})
	return h
}

// HandlerLimits is Handler with the priority levels sized by f (sluice
// controller --host-seats, --operator-seats).
func HandlerLimits(c *Controller, tokens *Tokens, errLog *log.Logger, f Fairness) http.Handler {
	_, h := newHandler(c, tokens, errLog, f)
	return h
}

func newHandler(c *Controller, tokens *Tokens, errLog *log.Logger, f Fairness) (*server, http.Handler) {
	f = f.withDefaults()
	s := &server{c: c, log: errLog, bodies: newBudget(bodyBudget), inflight: inflight{n: map[string]int{}},
		hosts: newLevel("hosts", f.HostSeats, f, c.met), operators: newLevel("operators", f.OperatorSeats, f, c.met)}
	mux := http.NewServeMux()
	// Who may call what: an operator token everything; a host's token
	// only its host's routes (host) and admission on its host (admit
	// checks the body's host).
	op := s.operatorOnly
	mux.HandleFunc("GET /v1/policy", op(s.getPolicy))
	mux.HandleFunc("POST /v1/policy", op(s.apply))
	mux.HandleFunc("GET /v1/hosts", op(s.getHosts))
	mux.HandleFunc("GET /v1/vms", op(s.getVMs))
	mux.HandleFunc("GET /v1/events", op(s.getEvents))
	mux.HandleFunc("GET /v1/decisions", op(s.getDecisions))
	mux.HandleFunc("POST /v1/set", op(s.set))
	mux.HandleFunc("POST /v1/decisions/{seq}/approve", op(s.approve))
	mux.HandleFunc("GET /v1/explain", op(s.explain))
	mux.HandleFunc("POST /v1/what-if", op(s.whatIf))
	mux.HandleFunc("GET /v1/history", op(s.history))
	mux.HandleFunc("POST /v1/vms/{vm}/power-on", op(s.powerOn))
	mux.HandleFunc("POST /v1/vms/{vm}/migrate", op(s.migrate))
	mux.HandleFunc("POST /v1/vms/{vm}/admit", s.admit)
	mux.HandleFunc("POST /v1/hosts/{host}/register", s.hostOnly(s.register))
	mux.HandleFunc("POST /v1/hosts/{host}/heartbeat", s.hostOnly(s.heartbeat))
	mux.HandleFunc("POST /v1/hosts/{host}/report", s.hostOnly(s.report))
	mux.HandleFunc("GET /v1/hosts/{host}/desired", s.hostOnly(s.desired))
	return s, c.met.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 7235).
		scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		id, valid := tokens.Lookup(strings.TrimSpace(tok))
		if !ok || !strings.EqualFold(scheme, "Bearer") || !valid {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			writeJSON(w, http.StatusUnauthorized, ErrorBody{Error: "a valid bearer token is required"})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		// A host's token has places of its own for requests in flight
		// (waiting for a seat or served), so that a host gone wrong
		// cannot hold the controller from the others.
		if id.Host != "" {
			key, max := id.key(), MaxInFlight
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/desired") {
				key, max = key+" watches", MaxWatches
			}
			if !s.inflight.enter(key, max) {
				w.Header().Set("Retry-After", "1")
				writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: fmt.Sprintf("this host's token has %d requests of this kind under way already: retry in a second", max)})
				return
			}
			defer s.inflight.leave(key)
		}
		if r.ContentLength > maxBody {
			// Refused unread: an HTTP/1 connection is closed rather than
			// drained (an HTTP/2 stream is reset, its connection stays).
			if r.ProtoMajor < 2 {
				w.Header().Set("Connection", "close")
			}
			writeJSON(w, http.StatusRequestEntityTooLarge, ErrorBody{Error: fmt.Sprintf("body larger than %d bytes (Content-Length: %d)", maxBody, r.ContentLength)})
			return
		}
		// A seat of the token's level, in turn with the other flows
		// of the level (fairness.go).
		lv := s.operators
		if id.Host != "" {
			lv = s.hosts
		}
		st, err := lv.enter(r.Context(), id.Flow)
		if err != nil {
			lv.refuse(w, id.Flow, err)
			return
		}
		defer st.release()
		r = r.WithContext(context.WithValue(r.Context(), seatKey{}, st))
		if n := bodyWeight(r); n > 0 {
			if !s.bodies.take(r.Context(), n, budgetWait) {
				w.Header().Set("Retry-After", "1")
				writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "too many large requests at once: retry in a second"})
				return
			}
			defer s.bodies.give(n)
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		mux.ServeHTTP(w, r)
		if sw, ok := w.(*statusWriter); ok {
			sw.route = r.Pattern // r is a copy (the identity): its pattern for the metrics
		}
	}))
}

// Limits on the requests of one host's token in flight at once; a
// request beyond gets 429 with Retry-After.
const (
	MaxInFlight = 16 // requests other than watches (an agent sends one at a time)
	MaxWatches  = 4  // long polls of its desired state (an agent holds one)
)

// inflight counts the requests under way per key.
type inflight struct {
	mu sync.Mutex
	n  map[string]int
}

// enter counts a request of key in unless key has max under way.
func (f *inflight) enter(key string, max int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] >= max {
		return false
	}
	f.n[key]++
	return true
}

func (f *inflight) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key]--; f.n[key] <= 0 {
		delete(f.n, key)
	}
}

type identityKey struct{}

// identity is who the request's token acts as (Handler checked it).
func identity(r *http.Request) Identity {
	id, _ := r.Context().Value(identityKey{}).(Identity)
	return id
}

// forbidden is the answer to a host's token outside its host's routes.
func forbidden(id Identity) error {
	return apiErr(http.StatusForbidden, "this token acts as host %s: it may only register, heartbeat, report and read the desired state of %s, and ask admission on %s", id.Host, id.Host, id.Host)
}

// operatorOnly refuses h to a host's token.
func (s *server) operatorOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if id := identity(r); id.Host != "" {
			s.reply(w, nil, forbidden(id))
			return
		}
		h(w, r)
	}
}

// hostOnly refuses h, a route of host {host}, to the token of another
// host.
func (s *server) hostOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if id := identity(r); id.Host != "" && id.Host != r.PathValue("host") {
			s.reply(w, nil, forbidden(id))
			return
		}
		h(w, r)
	}
}

type server struct {
	c                *Controller
	log              *log.Logger
	bodies           *budget
	inflight         inflight
	hosts, operators *level // the priority levels of hosts' and operators' tokens
}

// bodyWeight is what reading r's body takes of the budget: its declared
// length when it is large, maxBody when it declares none, else 0.
func bodyWeight(r *http.Request) int64 {
	switch {
	case r.ContentLength > largeBody:
		return r.ContentLength
	case r.ContentLength < 0:
		return maxBody
	}
	return 0
}

// budget is a number of bytes that requests take while they read their
// bodies and give back when done.
type budget struct {
	mu   sync.Mutex
	free int64
	wake chan struct{} // closed (and replaced) when bytes are given back
}

func newBudget(n int64) *budget { return &budget{free: n, wake: make(chan struct{})} }

// take takes n bytes, waiting at most wait (or until ctx ends) for them;
// it reports whether it took them.
func (b *budget) take(ctx context.Context, n int64, wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return true
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// give gives back n bytes taken.
func (b *budget) give(n int64) {
	b.mu.Lock()
	b.free += n
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// reply writes v, or err as an ErrorBody with its status (500 for an
// error that is not an *Error, logged).
func (s *server) reply(w http.ResponseWriter, v any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	var e *Error
	if errors.As(err, &e) {
		writeJSON(w, e.Status, e.Body)
		return
	}
	status := http.StatusInternalServerError
	if errors.Is(err, errConflict) {
		status = http.StatusConflict
	} else if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusServiceUnavailable
	}
	if s.log != nil {
		s.log.Printf("%v", err)
	}
	writeJSON(w, status, ErrorBody{Error: firstLine(err.Error())})
}

// decode reads a JSON body into v; unknown fields are errors.
func decode(r *http.Request, v any) error {
	body := io.Reader(r.Body)
	if r.ContentLength < 0 {
		sp := spool(body)
		defer sp.release()
		if sp.err != nil {
			return bodyErr(sp.err)
		}
		body = sp.reader()
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return apiErr(http.StatusBadRequest, "empty body: want JSON")
		}
		return bodyErr(err)
	}
	return nil
}

// bodyErr is the API error of a body that could not be read or decoded:
// 413 beyond the cap, else 400.
func bodyErr(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return apiErr(http.StatusRequestEntityTooLarge, "body larger than %d bytes", mbe.Limit)
	}
	return apiErr(http.StatusBadRequest, "body: %v", err)
}

// spooled is a body of unknown length (chunked), read in pieces of 1 MiB
// from a pool until its end or the cap: a body beyond the cap costs the
// cap and no more, and the pieces serve the next body (a JSON decoder
// reading it would double its buffer up to 1.6 times the cap, allocating
// twice that, garbage for each body).
type spooled struct {
	pieces [][]byte
	err    error
}

var pieces = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func spool(body io.Reader) *spooled {
	sp := &spooled{}
	for {
		buf := *pieces.Get().(*[]byte)
		n, err := io.ReadFull(body, buf)
		sp.pieces = append(sp.pieces, buf[:n])
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return sp
		case err != nil:
			sp.err = err
			return sp
		}
	}
}

// reader reads what was spooled.
func (sp *spooled) reader() io.Reader {
	rs := make([]io.Reader, len(sp.pieces))
	for i, p := range sp.pieces {
		rs[i] = bytes.NewReader(p)
	}
	return io.MultiReader(rs...)
}

// release gives the pieces back to the pool (what was decoded from them
// is a copy).
func (sp *spooled) release() {
	for _, p := range sp.pieces {
		p = p[:cap(p)]
		pieces.Put(&p)
	}
	sp.pieces = nil
}

func (s *server) getPolicy(w http.ResponseWriter, r *http.Request) {
	p, err := s.c.Policy(r.Context())
	s.reply(w, p, err)
}

func (s *server) apply(w http.ResponseWriter, r *http.Request) {
	var req ApplyRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	res, err := s.c.Apply(r.Context(), req)
	s.reply(w, res, err)
}

func (s *server) getHosts(w http.ResponseWriter, r *http.Request) {
	hs, err := s.c.Hosts(r.Context())
	s.reply(w, hs, err)
}

func (s *server) getVMs(w http.ResponseWriter, r *http.Request) {
	vs, err := s.c.VMs(r.Context())
	s.reply(w, vs, err)
}

// queryInt reads an integer query parameter (default 0).
func queryInt(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, apiErr(http.StatusBadRequest, "%s=%q: want an integer ≥ 0", name, v)
	}
	return n, nil
}

func (s *server) getEvents(w http.ResponseWriter, r *http.Request) {
	after, err := queryInt(r, "after")
	if err != nil {
		s.reply(w, nil, err)
		return
	}
	limit, err := queryInt(r, "limit")
	if err != nil {
		s.reply(w, nil, err)
		return
	}
	evs, err := s.c.Events(r.Context(), after, limit)
	s.reply(w, evs, err)
}

func (s *server) getDecisions(w http.ResponseWriter, r *http.Request) {
	after, err := queryInt(r, "after")
	if err != nil {
		s.reply(w, nil, err)
		return
	}
	limit, err := queryInt(r, "limit")
	if err != nil {
		s.reply(w, nil, err)
		return
	}
	ds, err := s.c.Decisions(r.Context(), after, limit)
	s.reply(w, ds, err)
}

func (s *server) set(w http.ResponseWriter, r *http.Request) {
	var req SetRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	res, err := s.c.Set(r.Context(), req)
	s.reply(w, res, err)
}

func (s *server) whatIf(w http.ResponseWriter, r *http.Request) {
	var req SetRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	res, err := s.c.WhatIf(r.Context(), req)
	s.reply(w, res, err)
}

func (s *server) history(w http.ResponseWriter, r *http.Request) {
	port := r.URL.Query().Get("port")
	if err := checkText("port", port); err != nil {
		s.reply(w, nil, err)
		return
	}
	s.reply(w, s.c.RateHistory(port), nil)
}

func (s *server) approve(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq <= 0 {
		s.reply(w, nil, apiErr(http.StatusBadRequest, "decision %q: want its number", r.PathValue("seq")))
		return
	}
	var req ApproveRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.reply(w, nil, err)
			return
		}
	}
	res, err := s.c.Approve(r.Context(), seq, req.Reason)
	s.reply(w, res, err)
}

func (s *server) explain(w http.ResponseWriter, r *http.Request) {
	port := r.URL.Query().Get("port")
	if port == "" {
		s.reply(w, nil, apiErr(http.StatusBadRequest, "missing ?port=VM/NIC"))
		return
	}
	e, err := s.c.Explain(r.Context(), port)
	s.reply(w, e, err)
}

func (s *server) powerOn(w http.ResponseWriter, r *http.Request) {
	var req PowerOnRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.reply(w, nil, err)
			return
		}
	}
	res, err := s.c.PowerOn(r.Context(), r.PathValue("vm"), req)
	s.reply(w, res, err)
}

func (s *server) admit(w http.ResponseWriter, r *http.Request) {
	var req AdmitRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	if id := identity(r); id.Host != "" && id.Host != req.Host {
		s.reply(w, nil, forbidden(id))
		return
	}
	ans, err := s.c.Admit(r.Context(), r.PathValue("vm"), req)
	s.reply(w, ans, err)
}

func (s *server) migrate(w http.ResponseWriter, r *http.Request) {
	var req MigrateRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	res, err := s.c.Migrate(r.Context(), r.PathValue("vm"), req)
	s.reply(w, res, err)
}

func (s *server) register(w http.ResponseWriter, r *http.Request) {
	var req RegisterRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	l, err := s.c.Register(r.Context(), r.PathValue("host"), req.Report)
	s.reply(w, l, err)
}

func (s *server) heartbeat(w http.ResponseWriter, r *http.Request) {
	var req HeartbeatRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	err := s.c.Heartbeat(r.Context(), r.PathValue("host"), req.LeaseID)
	s.reply(w, struct{}{}, err)
}

func (s *server) report(w http.ResponseWriter, r *http.Request) {
	var req ReportRequest
	if err := decode(r, &req); err != nil {
		s.reply(w, nil, err)
		return
	}
	err := s.c.Report(r.Context(), r.PathValue("host"), req.LeaseID, req.Report)
	s.reply(w, struct{}{}, err)
}

func (s *server) desired(w http.ResponseWriter, r *http.Request) {
	after, err := queryInt(r, "after")
	if err != nil {
		s.reply(w, nil, err)
		return
	}
	wait := time.Duration(0)
	if v := r.URL.Query().Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			s.reply(w, nil, apiErr(http.StatusBadRequest, "wait=%q: want a duration such as 30s", v))
			return
		}
	}
	// The seat is given back when the poll starts waiting for a change.
	d, err := s.c.watchDesired(r.Context(), r.PathValue("host"), after, wait, seatOf(r).release)
	s.reply(w, d, err)
}
