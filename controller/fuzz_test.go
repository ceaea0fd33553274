package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzAPI sends any method, path, body and token (none, wrong, the
// operator's, h1's) to the API on the embedded etcd: it never panics; an
// answer of the API's own (JSON) is one line; a request without a valid
// token gets 401; h1's token is answered 200 only on h1's routes and
// admissions.
func FuzzAPI(f *testing.F) {
	c := New(Config{Client: testEtcd.Client, Prefix: "/fuzz/" + f.Name() + "/", ChooseHosts: true})
	doc, err := os.ReadFile(filepath.Join("..", "examples", "netioc-fig2.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	if _, err := c.Apply(context.Background(), ApplyRequest{Document: string(doc)}); err != nil {
		f.Fatal(err)
	}
	toks, err := ParseTokens([]byte(testToken + "\n" + h1Token + " host=h1\n"))
	if err != nil {
		f.Fatal(err)
	}
	h := Handler(c, toks, nil)
	for _, r := range routes {
		f.Add(uint8(0), r.method, r.path, []byte(r.body))
		f.Add(uint8(2), r.method, r.path, []byte(r.body))
	}
	f.Add(uint8(2), "POST", "/v1/vms/vm1/admit", []byte(`{"host":"h2"}`))
	f.Add(uint8(0), "POST", "/v1/set", []byte(`{"changes":["vm1/nic0.shares=60"],"reason":"`+strings.Repeat("x", 2000)+`"}`))
	f.Add(uint8(0), "GET", "/v1/events?after=-1&limit=99999999999999999999", []byte{})
	f.Fuzz(func(t *testing.T, who uint8, method, path string, body []byte) {
		// A watch or a wait for the body budget ends with the request.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "https://127.0.0.1:7443"+path, bytes.NewReader(body))
		if err != nil || !strings.HasPrefix(req.URL.Path, "/") {
			return
		}
		req.RemoteAddr = "127.0.0.1:50000"
		tok := []string{"", "wrong-token-0123456789", testToken, h1Token}[who%4]
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Header().Get("Content-Type") == "application/json" && w.Code != http.StatusOK {
			var e ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" || strings.Contains(e.Error, "\n") {
				t.Fatalf("%s %s: %d %q: not one line of ErrorBody", method, path, w.Code, w.Body.String())
			}
		}
		switch {
		case who%4 < 2 && w.Code != http.StatusUnauthorized:
			t.Fatalf("%s %s without a valid token: %d", method, path, w.Code)
		case who%4 == 3 && w.Code == http.StatusOK && !strings.HasPrefix(req.URL.Path, "/v1/hosts/h1/") && !strings.HasSuffix(req.URL.Path, "/admit"):
			t.Fatalf("%s %s with h1's token: 200", method, path)
		}
	})
}
