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
	"testing"
	"time"
)

// routes is every route of the API, with a body that would change the
// state if it were accepted.
var routes = []struct{ method, path, body string }{
	{"GET", "/v1/policy", ""},
	{"POST", "/v1/policy", `{"file":"x.yaml","document":"cluster: x\n"}`},
	{"GET", "/v1/hosts", ""},
	{"GET", "/v1/vms", ""},
	{"GET", "/v1/events", ""},
	{"GET", "/v1/decisions", ""},
	{"POST", "/v1/set", `{"changes":["vm1/nic0.reservation=1Gbps"]}`},
	{"POST", "/v1/decisions/1/approve", `{}`},
	{"GET", "/v1/explain?port=vm1/nic0", ""},
	{"POST", "/v1/what-if", `{"changes":["vm1/nic0.reservation=1Gbps"]}`},
	{"GET", "/v1/history?port=vm1/nic0", ""},
	{"POST", "/v1/vms/vm3/power-on", `{}`},
	{"POST", "/v1/vms/vm2/migrate", `{"to":"h2"}`},
	{"POST", "/v1/vms/vm3/admit", `{"host":"h1"}`},
	{"POST", "/v1/hosts/h1/register", `{"vms":["vm1"],"uplinks":["vmnic0"]}`},
	{"POST", "/v1/hosts/h1/heartbeat", `{"lease_id":1}`},
	{"POST", "/v1/hosts/h1/report", `{"lease_id":1,"report":{"vms":[]}}`},
	{"GET", "/v1/hosts/h1/desired?wait=1s", ""},
	{"GET", "/v1/no-such-route", ""},
}

// TestUnauthorized sends every route without a token, with a wrong one,
// with a token that is a prefix of the right one and with another scheme:
// each gets 401 and the state is unchanged.
func TestUnauthorized(t *testing.T) {
	f := newFixture(t, true)
	f.apply(offDoc(t))
	before := f.dump()
	for _, r := range routes {
		for _, auth := range []string{"", "Bearer ", "Bearer wrong-token-0123456789", "Bearer " + testToken[:len(testToken)-1], "Bearer " + testToken + "x", "Basic " + testToken, "Bearertoken " + testToken} {
			req, err := http.NewRequest(r.method, f.srv.URL+r.path, strings.NewReader(r.body))
			if err != nil {
				t.Fatal(err)
			}
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s with %q: %d, want 401", r.method, r.path, auth, resp.StatusCode)
			}
		}
	}
	if after := f.dump(); after != before {
		t.Errorf("state changed:\n%s\n%s", before, after)
	}
	// The same routes with the token are served (not 401), the scheme in
	// any case (RFC 7235).
	for i, r := range routes {
		req, _ := http.NewRequest(r.method, f.srv.URL+r.path, strings.NewReader(r.body))
		req.Header.Set("Authorization", []string{"Bearer ", "bearer ", "BEARER "}[i%3]+testToken)
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", r.method, r.path)
		}
	}
}

// TestHostTokens sends every route with the operator's token and with
// the tokens of h1 and h2, on h1's and h2's host routes: a host's token
// gets 403 outside its own host's routes and admission on its host,
// with the state unchanged; every other call is served.
func TestHostTokens(t *testing.T) {
	f := newFixture(t, true)
	f.apply(offDoc(t))
	type call struct{ method, path, body, host string } // host: whose route ("" operator's)
	var calls []call
	for _, r := range routes {
		path := strings.Replace(r.path, "wait=1s", "wait=0s", 1)
		switch {
		case strings.HasPrefix(path, "/v1/hosts/h1/"):
			calls = append(calls, call{r.method, path, r.body, "h1"}, call{r.method, strings.Replace(path, "h1", "h2", 1), r.body, "h2"})
		case strings.HasSuffix(path, "/admit"):
			calls = append(calls, call{r.method, path, r.body, "h1"}, call{r.method, path, strings.Replace(r.body, "h1", "h2", 1), "h2"})
		default:
			calls = append(calls, call{r.method, path, r.body, ""})
		}
	}
	do := func(c call, tok string) (int, string) {
		req, _ := http.NewRequest(c.method, f.srv.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error
	}
	tokens := map[string]string{"": testToken, "h1": h1Token, "h2": h2Token}
	before := f.dump()
	allowed := 0
	for _, c := range calls {
		for _, who := range []string{"", "h1", "h2"} {
			if who == "" || c.host == who || c.path == "/v1/no-such-route" {
				allowed++
				continue
			}
			status, msg := do(c, tokens[who])
			if status != http.StatusForbidden || msg != "this token acts as host "+who+": it may only register, heartbeat, report and read the desired state of "+who+", and ask admission on "+who {
				t.Errorf("%s %s %s as %s: %d %q, want 403", c.method, c.path, c.body, who, status, msg)
			}
		}
	}
	if after := f.dump(); after != before {
		t.Errorf("a forbidden call changed the state:\n%s\n%s", before, after)
	}
	served := 0
	for _, c := range calls {
		for _, who := range []string{"", "h1", "h2"} {
			if who == "" || c.host == who || c.path == "/v1/no-such-route" {
				if status, msg := do(c, tokens[who]); status == http.StatusForbidden || status == http.StatusUnauthorized {
					t.Errorf("%s %s %s as %q: %d %s", c.method, c.path, c.body, who, status, msg)
				}
				served++
			}
		}
	}
	// 19 routes, 5 of them per host: 24 calls, each by the operator, the
	// host routes and admissions by their host, the unknown route by all.
	if served != allowed || served != 24+10+2 {
		t.Errorf("%d calls served, %d expected", served, allowed)
	}
}

func TestTokens(t *testing.T) {
	if _, err := ParseTokens([]byte("short\n")); err == nil {
		t.Error("a short token was accepted")
	}
	if _, err := ParseTokens([]byte("# only a comment\n\n")); err == nil {
		t.Error("a file without a token was accepted")
	}
	toks, err := ParseTokens([]byte("aaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbb\n"))
	if err != nil || !toks.Valid("bbbbbbbbbbbbbbbb") || toks.Valid("") || toks.Valid("cccccccccccccccc") {
		t.Fatalf("tokens: %v", err)
	}
	// A token may name the host it acts as; anything else after it is
	// refused, naming the line.
	toks, err = ParseTokens([]byte("aaaaaaaaaaaaaaaa\n  bbbbbbbbbbbbbbbb   host=h1 \n"))
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := toks.Lookup("bbbbbbbbbbbbbbbb"); !ok || id.Host != "h1" {
		t.Errorf("host token: %+v %v", id, ok)
	}
	if id, ok := toks.Lookup("aaaaaaaaaaaaaaaa"); !ok || id.Host != "" {
		t.Errorf("operator token: %+v %v", id, ok)
	}
	// The line of a host's token, as given to its agent, reads as the token.
	line := filepath.Join(t.TempDir(), "h1.token")
	if err := os.WriteFile(line, []byte("# the agent of h1\nbbbbbbbbbbbbbbbb host=h1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadToken(line); tok != "bbbbbbbbbbbbbbbb" || err != nil {
		t.Errorf("ReadToken of a host's line: %q %v", tok, err)
	}
	for _, bad := range []string{"aaaaaaaaaaaaaaaa role=admin", "aaaaaaaaaaaaaaaa host=", "aaaaaaaaaaaaaaaa host=h1 host=h2",
		"aaaaaaaaaaaaaaaa host=a/b", "aaaaaaaaaaaaaaaa\naaaaaaaaaaaaaaaa host=h1", "short host=h1"} {
		if _, err := ParseTokens([]byte("# x\n" + bad + "\n")); err == nil || !strings.HasPrefix(err.Error(), "line ") {
			t.Errorf("%q: %v, want refused naming the line", bad, err)
		}
	}
	dir := t.TempDir()
	if _, err := LoadTokens("", dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi.Mode(), err)
	}
	tok, _ := ReadToken(filepath.Join(dir, TokenFile))
	again, err := LoadTokens("", dir) // the second start keeps it
	if err != nil || !again.Valid(tok) || len(tok) != 64 {
		t.Fatalf("token %q: %v", tok, err)
	}
	// A tokens file others can read is refused, with the fix.
	open := filepath.Join(dir, "tokens")
	if err := os.WriteFile(open, []byte("aaaaaaaaaaaaaaaa\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(open, dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable tokens file: %v, want refused", err)
	}
	// The token goes over TLS only.
	if _, err := NewClient("http://127.0.0.1:7443", tok, ""); err == nil || !strings.Contains(err.Error(), "only over TLS") {
		t.Errorf("a client of http://: %v, want refused", err)
	}
}

// TestTLS serves the API with the generated certificate on 127.0.0.1 and
// talks to it with NewClient trusting that certificate only.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, err := EnsureCert("", "", dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v", err)
	}
	if _, _, err := EnsureCert("x.pem", "", dir); err == nil {
		t.Error("a certificate without a key was accepted")
	}
	c := New(Config{Client: testEtcd.Client, Prefix: testPrefix(t)})
	toks, _ := ParseTokens([]byte(testToken))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer("", Handler(c, toks, nil))
	go srv.ServeTLS(l, cert, key)
	t.Cleanup(func() { srv.Close() })
	for _, host := range []string{"127.0.0.1", "localhost"} {
		cl, err := NewClient("https://"+host+":"+portOf(l), testToken, cert)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := cl.Hosts(context.Background()); err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		t.Logf("first request to %s (TLS handshake): %v", host, time.Since(start))
	}
	// A client that does not trust the certificate fails.
	cl, _ := NewClient("https://127.0.0.1:"+portOf(l), testToken, "")
	if _, err := cl.Hosts(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted certificate: %v", err)
	}
}

func portOf(l net.Listener) string {
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// TestHostInFlight: a host's token gets 429 (Retry-After) beyond
// MaxWatches long polls or MaxInFlight other requests under way; other
// hosts and operators are not held by it, and every request gives its
// place back.
func TestHostInFlight(t *testing.T) {
	c := New(Config{Client: testEtcd.Client, Prefix: testPrefix(t)})
	if _, err := c.Apply(context.Background(), ApplyRequest{Document: offDoc(t)}); err != nil {
		t.Fatal(err)
	}
	toks, err := ParseTokens([]byte(testToken + "\n" + h1Token + " host=h1\n" + h2Token + " host=h2\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, h := newHandler(c, toks, nil, Fairness{})
	do := func(method, path, tok string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(`{"lease_id":1}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	// h1 holds all its places (as if its requests were under way).
	s.inflight.n["host h1 watches"], s.inflight.n["host h1"] = MaxWatches, MaxInFlight
	for _, tc := range []struct {
		method, path, tok string
		want              int
	}{
		{"GET", "/v1/hosts/h1/desired?wait=0s", h1Token, http.StatusTooManyRequests},
		{"POST", "/v1/hosts/h1/heartbeat", h1Token, http.StatusTooManyRequests},
		{"GET", "/v1/hosts/h2/desired?wait=0s", h2Token, http.StatusOK},
		{"POST", "/v1/hosts/h2/heartbeat", h2Token, http.StatusNotFound}, // served: no lease 1
		{"GET", "/v1/hosts/h1/desired?wait=0s", testToken, http.StatusOK},
	} {
		w := do(tc.method, tc.path, tc.tok)
		if w.Code != tc.want || tc.want == http.StatusTooManyRequests && w.Header().Get("Retry-After") != "1" {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, w.Code, w.Body, tc.want)
		}
	}
	// A place given back is taken again.
	s.inflight.leave("host h1 watches")
	if w := do("GET", "/v1/hosts/h1/desired?wait=0s", h1Token); w.Code != http.StatusOK {
		t.Errorf("after a place came back: %d %s", w.Code, w.Body)
	}
	if got := fmt.Sprint(s.inflight.n); got != fmt.Sprintf("map[host h1:%d host h1 watches:%d]", MaxInFlight, MaxWatches-1) {
		t.Errorf("places after the requests: %s", got)
	}
}
