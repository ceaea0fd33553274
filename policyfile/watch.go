// Package policyfile follows a policy file for a daemon of a host that
// runs without a controller (the agent, the storage gateway): it notices
// that the file changed, loads it and hands the new policy to the daemon.
// One rule for both daemons: a change is the file's content (not its
// modification time), it is loaded once it stayed the same for one poll,
// and a reload signal (SIGHUP) loads the file at once.
//
// It reads the file and nothing else: what a policy means is the
// daemon's, and a file that does not load leaves the daemon with its last
// good policy.
package policyfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"sluice/internal/clock"
	"sluice/internal/inputfile"
	"sluice/policy"
)

// Stamp identifies what a Watch would load from path: the SHA-256 of its
// content, or the error reading it. The content, not the modification
// time: two writes within one tick of the file system's clock keep the
// time. The read is bounded (policy.MaxFileBytes; a FIFO or a device is
// refused, not waited on).
func Stamp(path string) string {
	_, st, _ := read(path)
	return st
}

// read returns the content of path and its stamp.
func read(path string) ([]byte, string, error) {
	data, err := inputfile.Read(path, policy.MaxFileBytes)
	if err != nil {
		return nil, "error: " + err.Error(), err
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

// Watch follows a policy file: every Every it stamps the file (Stamp),
// and loads it when its stamp differs from the one last loaded and
// equals the one of the poll before, so that a file being written is not
// read half-written: a change is loaded at the second poll that sees it.
// A value on Reload loads the file at once, changed or not.
type Watch struct {
	// Path is the policy file.
	Path string
	// From is the Stamp of the file the daemon runs with, taken before it
	// loaded it (a change in between is then loaded); "": the first poll
	// that finds the file stable loads it.
	From string
	// Every is the time between two polls (ticks of Clock); 0: the file is
	// loaded only on Reload.
	Every time.Duration
	// Reload loads the file at once when it receives (signal.Notify it
	// with SIGHUP); nil: never.
	Reload <-chan os.Signal
	// Apply takes a policy that loaded and says what it did (Watch logs
	// no success). An error is logged; the same file is not applied again
	// until it changes or Reload.
	Apply func(*policy.Policy) error
	// Log gets one line per distinct failure in a row: a file that does
	// not load (slog.LevelWarn: the daemon keeps its last good policy) and
	// an Apply that failed (slog.LevelError). nil: discarded.
	Log func(level slog.Level, msg string)
	// Clock ticks the polls; nil: real time.
	Clock clock.Clock
}

// Run follows the file until ctx ends.
func (w *Watch) Run(ctx context.Context) {
	var ticks <-chan time.Time
	if w.Every > 0 {
		c, stop := clock.Or(w.Clock).NewTicker(w.Every)
		defer stop()
		ticks = c
	}
	s := follow{Watch: w, last: w.From, seen: w.From}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Reload:
			s.poll(ctx, true)
		case <-ticks:
			s.poll(ctx, false)
		}
	}
}

// follow is the state of a running Watch.
type follow struct {
	*Watch
	last    string // the stamp of the file last loaded (From at first)
	seen    string // the stamp at the last poll
	lastErr string // the failure last logged; "" after a success
}

// poll stamps the file and loads it when it changed and stayed the same
// since the last poll, or when force.
func (s *follow) poll(ctx context.Context, force bool) {
	data, st, err := read(s.Path)
	if !force {
		changed, stable := st != s.last, st == s.seen
		s.seen = st
		if !changed || !stable {
			return
		}
	}
	s.last, s.seen = st, st
	var p *policy.Policy
	if err == nil {
		p, err = policy.Parse(s.Path, data)
	}
	if err != nil {
		s.fail(slog.LevelWarn, fmt.Sprintf("policy %s not reloaded, keeping the last good one: %s", s.Path, oneLine(err.Error())))
		return
	}
	if err := s.Apply(p); err != nil {
		if ctx.Err() == nil {
			// errors.Join's lines, on one line
			s.fail(slog.LevelError, fmt.Sprintf("applying policy %s: %s", s.Path, strings.ReplaceAll(err.Error(), "\n", "; ")))
		}
		return
	}
	s.lastErr = ""
}

// fail logs msg unless it is the failure last logged.
func (s *follow) fail(level slog.Level, msg string) {
	if msg == s.lastErr {
		return
	}
	s.lastErr = msg
	if s.Log != nil {
		s.Log(level, msg)
	}
}

// oneLine is the first line of s, marked when more follow (policy.Errors
// lists one problem per line).
func oneLine(s string) string {
	if first, _, more := strings.Cut(s, "\n"); more {
		return first + " (and more)"
	}
	return s
}
