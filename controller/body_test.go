package controller

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lazyBody is a request body of n bytes made up as it is read (the start
// of an ApplyRequest whose document never ends), so that a test can send
// many large bodies without holding them. If gate is not nil, Read waits
// for it to close before giving anything.
type lazyBody struct {
	n, off int64
	gate   chan struct{}
	read   atomic.Int64
}

const lazyPrefix = `{"file": "big.yaml", "document": "`

func (b *lazyBody) Read(p []byte) (int, error) {
	if b.gate != nil {
		<-b.gate
	}
	if b.off >= b.n {
		return 0, io.EOF
	}
	k := int(min(int64(len(p)), b.n-b.off))
	for i := range k {
		if o := b.off + int64(i); o < int64(len(lazyPrefix)) {
			p[i] = lazyPrefix[o]
		} else {
			p[i] = 'a'
		}
	}
	b.off += int64(k)
	b.read.Add(int64(k))
	return k, nil
}

func (b *lazyBody) Close() error { return nil }

// bodyHandler is the API handler of a controller that no request in these
// tests reaches (their bodies are refused first), and a valid token.
func bodyHandler(t *testing.T) http.Handler {
	t.Helper()
	toks, err := ParseTokens([]byte(testToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return Handler(New(Config{Client: testEtcd.Client, Prefix: testPrefix(t)}), toks, nil)
}

func bigPost(body *lazyBody, declared bool) *http.Request {
	r := httptest.NewRequest("POST", "/v1/policy", body)
	r.Header.Set("Authorization", "Bearer "+testToken)
	r.ContentLength = -1 // chunked: the length is not known
	if declared {
		r.ContentLength = body.n
	}
	return r
}

// peakHeap runs f while sampling the heap, and returns the peak of
// HeapInuse above what it was before, and how much f allocated in all.
func peakHeap(f func()) (peak, total uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, alloc0 := m.HeapInuse, m.TotalAlloc
	var top atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var s runtime.MemStats
		for {
			runtime.ReadMemStats(&s)
			if s.HeapInuse > base && s.HeapInuse-base > top.Load() {
				top.Store(s.HeapInuse - base)
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	f()
	close(done)
	wg.Wait()
	runtime.ReadMemStats(&m)
	return top.Load(), m.TotalAlloc - alloc0
}

// TestLargeBodies sends sixteen concurrent POST /v1/policy with 50 MB
// bodies to the handler, in process. Declared by Content-Length, each gets
// 413 with the usual error body and none is read, so the handler
// allocates next to nothing (before: each was read to the 20 MiB cap, and
// the controller's peak RSS reached 673–724 MiB). Sent chunked, each is
// read until it passes the cap, at most two at once (the body budget):
// each gets 413, or 503 with Retry-After when the budget stays full, and
// the heap never holds more than a few bodies' worth — well under 16 ×
// 20 MiB.
func TestLargeBodies(t *testing.T) {
	h := bodyHandler(t)
	const n, size = 16, 50_000_000
	for _, declared := range []bool{true, false} {
		name := map[bool]string{true: "Content-Length", false: "chunked"}[declared]
		codes := make([]int, n)
		bodies := make([]string, n)
		retry := make([]string, n)
		read := make([]int64, n)
		peak, total := peakHeap(func() {
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b := &lazyBody{n: size}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, bigPost(b, declared))
					codes[i], bodies[i], retry[i], read[i] = w.Code, w.Body.String(), w.Header().Get("Retry-After"), b.read.Load()
				}()
			}
			wg.Wait()
		})
		tooLarge := 0
		for i := range n {
			var e ErrorBody
			if err := json.Unmarshal([]byte(bodies[i]), &e); err != nil || e.Error == "" || strings.Contains(e.Error, "\n") {
				t.Errorf("%s: request %d: status %d, body %q: want an ErrorBody of one line", name, i, codes[i], bodies[i])
			}
			switch {
			case codes[i] == http.StatusRequestEntityTooLarge && strings.Contains(e.Error, "larger than 20971520 bytes"):
				tooLarge++
			case codes[i] == http.StatusServiceUnavailable && !declared && retry[i] != "":
			default:
				t.Errorf("%s: request %d: %d %q (Retry-After %q)", name, i, codes[i], e.Error, retry[i])
			}
			if declared && read[i] != 0 {
				t.Errorf("%s: request %d: %d bytes of the body read, want none", name, i, read[i])
			}
			if read[i] > maxBody+1<<20 {
				t.Errorf("%s: request %d: %d bytes read, beyond the cap", name, i, read[i])
			}
		}
		if declared && tooLarge != n || tooLarge == 0 {
			t.Errorf("%s: %d of %d requests got 413", name, tooLarge, n)
		}
		t.Logf("%s: %d × 413, heap peak +%.1f MiB, %.1f MiB allocated in all", name, tooLarge, float64(peak)/(1<<20), float64(total)/(1<<20))
		limit := uint64(16 << 20) // nothing read: next to nothing held
		if !declared {
			limit = 4 * maxBody // two bodies at a time, spooled, and what a GC leaves
		}
		if peak > limit || declared && total > limit {
			t.Errorf("%s: heap peak +%d MiB, %d MiB allocated: want under %d MiB (16 × 20 MiB = 320 MiB)", name, peak>>20, total>>20, limit>>20)
		}
	}
}

// TestBodyBudget: while two chunked bodies are being read (the budget of
// two of maxBody), a third large request waits, then gets 503 with
// Retry-After; a small request is served meanwhile; once the two are done,
// the third's retry is read.
func TestBodyBudget(t *testing.T) {
	h := bodyHandler(t)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, bigPost(&lazyBody{n: 50_000_000, gate: gate}, false))
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Errorf("held request: %d %s", w.Code, w.Body)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond) // the two take the budget and wait at the gate
	third := &lazyBody{n: 50_000_000}
	w := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(w, bigPost(third, false))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || third.read.Load() != 0 {
		t.Errorf("third large request: %d, Retry-After %q, %d bytes read; want 503, 1, none", w.Code, w.Header().Get("Retry-After"), third.read.Load())
	}
	if waited := time.Since(start); waited < budgetWait/2 {
		t.Errorf("refused after %v: it should wait for the budget first", waited)
	}
	small := httptest.NewRequest("POST", "/v1/set", strings.NewReader(`{"changes": ["nonsense"]}`))
	small.Header.Set("Authorization", "Bearer "+testToken)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, small)
	if w.Code == http.StatusServiceUnavailable {
		t.Errorf("a small request waited for the budget: %d %s", w.Code, w.Body)
	}
	close(gate)
	wg.Wait()
	w = httptest.NewRecorder()
	h.ServeHTTP(w, bigPost(&lazyBody{n: 50_000_000}, false))
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("retry after the budget is free: %d %s", w.Code, w.Body)
	}
}
