package mclock

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// runDmclock: dmclock servers=N capacity=U duration=D [tracker=on|off]
// with one greedy client per input line: cN [r=] [s=] [l=] servers=0,1,..
//
// Every server is a device of the given capacity with its own Scheduler and
// every client has the same R/S/L at each of its servers (they are global
// settings). A client keeps greedyDepth requests queued at each of its
// servers; with tracker=on it sends Delta/Rho from a Tracker, as dmClock
// prescribes. Checked (tracker=on): each client's total service over all
// servers is at least its reservation and at most its limit, within 2%.
func runDmclock(t *testing.T, d *datadriven.TestData, a argMap) string {
	nsrv := a.int("servers", 2)
	capacity := a.float("capacity", 1000)
	dur := a.dur("duration", 100e9)
	useTracker := a.str("tracker", "on") == "on"
	type dmClient struct {
		p       Params
		servers []int
		tr      Tracker
	}
	var cs []*dmClient
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := map[string]string{}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		ca := argMap{t, m}
		c := &dmClient{p: Params{ReservationIOPS: ca.float("r", 0), Shares: ca.float("s", 1), LimitIOPS: ca.float("l", 0)}}
		for _, s := range strings.Split(ca.str("servers", "0"), ",") {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n >= nsrv {
				t.Fatalf("bad server %q", s)
			}
			c.servers = append(c.servers, n)
		}
		cs = append(cs, c)
	}
	scheds := make([]*Scheduler, nsrv)
	freeAt := make([]int64, nsrv)
	served := make([][]float64, len(cs))
	for i := range scheds {
		scheds[i] = New(Config{})
	}
	add := func(id, srv int) {
		var req Request
		req.Bytes = 4096
		if useTracker {
			req.Delta, req.Rho = cs[id].tr.Next(srv)
		}
		if err := scheds[srv].Add(id, req, freeAt[srv]); err != nil {
			t.Fatal(err)
		}
	}
	for id, c := range cs {
		served[id] = make([]float64, nsrv)
		for _, srv := range c.servers {
			if err := scheds[srv].AddClient(id, c.p); err != nil {
				t.Fatal(err)
			}
			for range greedyDepth {
				add(id, srv)
			}
		}
	}
	for {
		srv := 0
		for i := range freeAt {
			if freeAt[i] < freeAt[srv] {
				srv = i
			}
		}
		now := freeAt[srv]
		if now >= dur {
			break
		}
		s := scheds[srv]
		req, id, ok, next := s.Pull(now)
		if !ok {
			if next == Never {
				freeAt[srv] = dur
			} else {
				freeAt[srv] = max(next, now+1)
			}
			continue
		}
		cost := s.Cost(req.Bytes)
		served[id][srv] += float64(cost)
		cs[id].tr.Completed(srv, cost, s.LastPhase())
		freeAt[srv] = now + int64(float64(cost)/capacity*1e9)
		add(id, srv)
	}
	secs := float64(dur) / 1e9
	var b strings.Builder
	fmt.Fprintf(&b, "%-4s %6s %6s %6s", "", "r", "s", "l")
	for i := range nsrv {
		fmt.Fprintf(&b, " %9s", fmt.Sprintf("srv%d/s", i))
	}
	fmt.Fprintf(&b, " %9s\n", "total/s")
	for id, c := range cs {
		lim := "-"
		if c.p.LimitIOPS > 0 {
			lim = fmt.Sprintf("%g", c.p.LimitIOPS)
		}
		fmt.Fprintf(&b, "c%-3d %6g %6g %6s", id, c.p.ReservationIOPS, c.p.Shares, lim)
		total := 0.0
		for i := range nsrv {
			fmt.Fprintf(&b, " %9.1f", served[id][i]/secs)
			total += served[id][i] / secs
		}
		fmt.Fprintf(&b, " %9.1f\n", total)
		if !useTracker {
			continue
		}
		if total < 0.98*c.p.ReservationIOPS {
			fmt.Fprintf(&b, "  violation: c%d total %.1f below its reservation\n", id, total)
		}
		if c.p.LimitIOPS > 0 && total > 1.02*c.p.LimitIOPS {
			fmt.Fprintf(&b, "  violation: c%d total %.1f above its limit\n", id, total)
		}
	}
	return b.String()
}
