package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sluice/internal/clock"
	"sluice/internal/inputfile"
)

// NowNs is the real time in nanoseconds, for the first step of Run.
func NowNs() int64 { return time.Now().UnixNano() }

// Run installs the trees at nowNs and then steps every intervalNs until ctx
// ends, calling report with each step's statistics and error. In static mode
// the steps still reconcile (repairing drift) and refresh the statistics.
//
// Run follows the host without a restart: when the inventory signals a
// change (ChangeNotifier) it re-derives the trees (Resync), and it takes
// each policy of Config.Policies (SetPolicy); the next step, at most one
// interval later, applies them. A policy or a re-derivation that fails
// leaves the agent as it was; its error is reported with the next step's.
func Run(ctx context.Context, a *Agent, clk clock.Clock, nowNs, intervalNs int64, report func(Stats, Changes, error)) error {
	ch, err := a.Step(nowNs)
	report(a.Stats(), ch, err)
	if err != nil && ch.Total() == 0 {
		return err
	}
	var changes <-chan struct{}
	if n, ok := a.cfg.Inventory.(ChangeNotifier); ok {
		changes = n.Changes()
	}
	ticks, stop := clock.Or(clk).NewTicker(time.Duration(intervalNs))
	defer stop()
	var pending []error
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			if err := a.Resync(); err != nil {
				pending = append(pending, fmt.Errorf("re-deriving after an inventory change: %w", err))
			}
		case p := <-a.cfg.Policies:
			if err := a.SetPolicy(p); err != nil {
				pending = append(pending, fmt.Errorf("new policy not applied, keeping the last good one: %w", err))
			}
		case now := <-ticks:
			ch, err := a.Step(now.UnixNano())
			report(a.Stats(), ch, errors.Join(append(pending, err)...))
			pending = nil
		}
	}
}

// StatsPath is the statistics file of an agent.
func StatsPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("agent-%s-%s.json", cluster, host))
}

// WriteStats writes the statistics file atomically.
func WriteStats(dir string, s Stats) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	p := StatsPath(dir, s.Cluster, s.Host)
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// ReadStats reads an agent's statistics file. With cluster "" it finds the
// one file of the host in dir.
func ReadStats(dir, cluster, host string) (*Stats, error) {
	p := StatsPath(dir, cluster, host)
	if cluster == "" {
		m, _ := filepath.Glob(filepath.Join(dir, "agent-*-"+host+".json"))
		if len(m) != 1 {
			return nil, fmt.Errorf("no single statistics file for host %s in %s (found %d; give --policy)", host, dir, len(m))
		}
		p = m[0]
	}
	var s Stats
	err := inputfile.ReadJSON(p, inputfile.MaxStateBytes, &s)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no agent statistics for host %s (%s): is the agent running?", host, p)
	}
	if err != nil {
		return nil, err // PATH[:LINE]: message
	}
	return &s, nil
}
