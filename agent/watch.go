package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"sluice/internal/clock"
	"sluice/policy"
)

// WatchPolicy follows a policy file for Run (Config.Policies): every
// pollNs (ticks of clock; nil: real time) it compares the file's
// modification time and size with the last ones it loaded, and on a
// change that has lasted one poll (so that a file being written is not
// read half-written), or on a value of hup (SIGHUP), it loads the file with load and
// sends the new policy on out. A file that fails to load is not sent (the
// agent keeps the last good policy); logf gets one line per distinct
// failure (slog.LevelWarn) and per policy loaded (slog.LevelInfo). It
// returns when ctx ends.
func WatchPolicy(ctx context.Context, path string, clk clock.Clock, pollNs int64, hup <-chan struct{},
	load func(string) (*policy.Policy, error), out chan<- *policy.Policy, logf func(level slog.Level, line string)) {
	ticks, stop := clock.Or(clk).NewTicker(time.Duration(pollNs))
	defer stop()
	last := fileStamp(path) // of the file last loaded
	seen := last            // at the last poll
	lastErr := ""
	try := func(force bool) {
		st := fileStamp(path)
		if !force {
			// A change is loaded once the file has stayed the same for a
			// poll: a file being written is not read half-written.
			changed, stable := st != last, st == seen
			seen = st
			if !changed || !stable {
				return
			}
		}
		last, seen = st, st
		p, err := load(path)
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				logf(slog.LevelWarn, fmt.Sprintf("policy %s not reloaded, keeping the last good one: %s", path, oneLine(msg)))
				lastErr = msg
			}
			return
		}
		lastErr = ""
		select {
		case out <- p:
			logf(slog.LevelInfo, fmt.Sprintf("policy %s reloaded", path))
		case <-ctx.Done():
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			try(true)
		case <-ticks:
			try(false)
		}
	}
}

// fileStamp is what WatchPolicy compares: modification time and size.
func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d/%d", fi.ModTime().UnixNano(), fi.Size())
}

func oneLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i] + " (and more)"
		}
	}
	return s
}
