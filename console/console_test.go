package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

// TestHandler: / and /ui redirect to /ui/; the console's files are served
// with the CSP and no token; every other path is the API's.
func TestHandler(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "api "+r.URL.Path, http.StatusUnauthorized)
	})
	h := Handler(api)
	for _, p := range []string{"/", "/ui"} {
		if r := get(t, h, "GET", p); r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/ui/" {
			t.Errorf("GET %s: %d to %q", p, r.StatusCode, r.Header.Get("Location"))
		}
	}
	for _, p := range []string{"/ui/", "/ui/console.js", "/ui/console.css", "/ui/uPlot.iife.min.js", "/ui/uPlot.min.css"} {
		r := get(t, h, "GET", p)
		if r.StatusCode != http.StatusOK || r.Header.Get("Content-Security-Policy") != CSP || r.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: %d, headers %v", p, r.StatusCode, r.Header)
		}
	}
	if r := get(t, h, "POST", "/ui/"); r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d", r.StatusCode)
	}
	if r := get(t, h, "GET", "/ui/nothing.js"); r.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ui/nothing.js: %d", r.StatusCode)
	}
	for _, p := range []string{"/v1/hosts", "/metrics", "/uix"} {
		r := get(t, h, "GET", p)
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "api "+p) {
			t.Errorf("GET %s: %d %q, want the API's answer", p, r.StatusCode, b)
		}
	}
}

// TestNoInline: the page has no inline script, style or event handler
// (the CSP would block them) and loads only files of its own.
func TestNoInline(t *testing.T) {
	b, err := assets.ReadFile("assets/index.html")
	if err != nil {
		t.Fatal(err)
	}
	html := string(b)
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1) {
		if !strings.Contains(tag, ` src="`) {
			t.Errorf("inline script: %s", tag)
		}
	}
	for _, re := range []string{`<script[^>]*>\s*[^<\s]`, `\son[a-z]+\s*=`, `\sstyle\s*=`, `<style`, `javascript:`} {
		if m := regexp.MustCompile(re).FindString(html); m != "" {
			t.Errorf("index.html has %q (%s)", m, re)
		}
	}
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(html, -1) {
		if strings.Contains(m[1], ":") || strings.HasPrefix(m[1], "//") {
			t.Errorf("index.html loads %s from elsewhere", m[1])
			continue
		}
		if _, err := assets.ReadFile("assets/" + m[1]); err != nil {
			t.Errorf("index.html loads %s: %v", m[1], err)
		}
	}
}
