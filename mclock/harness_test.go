package mclock

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs testdata/*.txt. Directives:
//
//	new [chunk=32KiB] [at-limit=wait|allow]
//	client id=N [r=IOPS] [s=SHARES] [l=IOPS]       add a client
//	update id=N [r=IOPS] [s=SHARES] [l=IOPS]       change a client
//	add id=N [n=1] [bytes=4KiB] [t=0ms] [delta=0] [rho=0]
//	remove id=N                                    remove a client
//	pull t=DUR [n=1] [every=DUR]                   pull n times, t advancing by every
//	stats                                          per-client counters
//	sim capacity=UNITS/s duration=DUR [at-limit=..] [chunk=..]   (clients as input lines)
//	agree seed=N trials=N                          random sims against alloc
//	lag ...                                        reactivation burst (see lag_test.go)
//	dmclock servers=N capacity=U duration=D [tracker=on|off]   (see dmclock_test.go)
//
// Every pull checks the phase invariants (a reservation-phase request had its
// R tag due, a weight-phase request was under its limit, nothing was served
// over the limit under Wait) and prints violations.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var s *Scheduler
		var handle uint64
		lastHandle := map[int]uint64{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			a := args(t, d)
			switch d.Cmd {
			case "new":
				s = New(Config{ChunkBytes: a.bytes("chunk", 0), AtLimit: a.atLimit()})
				return "ok"
			case "client", "update":
				p := Params{ReservationIOPS: a.float("r", 0), Shares: a.float("s", 1), LimitIOPS: a.float("l", 0)}
				var err error
				if d.Cmd == "client" {
					err = s.AddClient(a.int("id", 0), p)
				} else {
					err = s.Update(a.int("id", 0), p)
				}
				if err != nil {
					return "error: " + err.Error()
				}
				return "ok"
			case "add":
				id := a.int("id", 0)
				for range a.int("n", 1) {
					handle++
					req := Request{Bytes: a.bytes("bytes", 4096), Delta: uint32(a.int("delta", 0)), Rho: uint32(a.int("rho", 0)), Handle: handle}
					if err := s.Add(id, req, a.dur("t", 0)); err != nil {
						return "error: " + err.Error()
					}
				}
				return fmt.Sprintf("queued=%d", s.Len())
			case "remove":
				n, err := s.RemoveClient(a.int("id", 0))
				if err != nil {
					return "error: " + err.Error()
				}
				return fmt.Sprintf("dropped=%d queued=%d", n, s.Len())
			case "pull":
				return pullTrace(s, a.dur("t", 0), a.int("n", 1), a.dur("every", 0), lastHandle)
			case "stats":
				return statsTable(s)
			case "sim":
				return runSimDirective(t, d, a)
			case "agree":
				return runAgree(a.int("seed", 1), a.int("trials", 10))
			case "lag":
				return runLag(a)
			case "dmclock":
				return runDmclock(t, d, a)
			}
			t.Fatalf("unknown directive %q", d.Cmd)
			return ""
		})
	})
}

func pullTrace(s *Scheduler, t0 int64, n int, every int64, lastHandle map[int]uint64) string {
	var b strings.Builder
	now := t0
	for range n {
		// Tags of the head that will be served, read before Pull.
		pre := map[int][3]int64{}
		for _, c := range s.clients {
			if c != nil && c.qLen > 0 {
				pre[c.id] = c.tag
			}
		}
		req, id, ok, next := s.Pull(now)
		if !ok {
			if next == Never {
				fmt.Fprintf(&b, "t=%s none\n", fmtNs(now))
			} else {
				fmt.Fprintf(&b, "t=%s none next=%s\n", fmtNs(now), fmtNs(next))
			}
		} else {
			if req.Handle <= lastHandle[id] {
				fmt.Fprintf(&b, "  violation: c%d served out of FIFO order\n", id)
			}
			lastHandle[id] = req.Handle
			tg := pre[id]
			ph := s.LastPhase()
			fmt.Fprintf(&b, "t=%s c%d %-6s cost=%d R=%s L=%s\n", fmtNs(now), id, ph, s.Cost(req.Bytes), fmtTag(tg[kR]), fmtNs(tg[kL]))
			switch {
			case ph == Reservation && tg[kR] > now:
				fmt.Fprintf(&b, "  violation: reservation phase served R tag %s > now\n", fmtNs(tg[kR]))
			case ph == Weight && tg[kL] > now:
				fmt.Fprintf(&b, "  violation: weight phase served L tag %s > now\n", fmtNs(tg[kL]))
			case ph == OverLimit && s.atLimit == Wait:
				b.WriteString("  violation: served over limit under Wait\n")
			}
		}
		now += every
	}
	return b.String()
}

func statsTable(s *Scheduler) string {
	var b strings.Builder
	for _, c := range s.clients {
		if c == nil {
			continue
		}
		st, _ := s.Stats(c.id)
		fmt.Fprintf(&b, "c%d queued=%d served=%d cost=%d resv=%d weight=%d overlimit=%d\n",
			c.id, st.Queued, st.Served, st.ServedCost, st.ByReservation, st.ByWeight, st.OverLimit)
		if st.ByReservation+st.ByWeight+st.OverLimit != st.ServedCost {
			b.WriteString("  violation: phase counters do not add up to served cost\n")
		}
	}
	return b.String()
}

func fmtNs(ns int64) string {
	if ns == Never {
		return "never"
	}
	return strconv.FormatFloat(float64(ns)/1e6, 'f', -1, 64) + "ms"
}

func fmtTag(ns int64) string {
	if ns == Never {
		return "-"
	}
	return fmtNs(ns)
}

// argMap gives typed access to a directive's key=value arguments.
type argMap struct {
	t testing.TB
	m map[string]string
}

func args(t testing.TB, d *datadriven.TestData) argMap {
	m := map[string]string{}
	for _, a := range d.CmdArgs {
		if len(a.Vals) > 0 {
			m[a.Key] = a.Vals[0]
		} else {
			m[a.Key] = ""
		}
	}
	return argMap{t, m}
}

func (a argMap) has(k string) bool { _, ok := a.m[k]; return ok }

func (a argMap) str(k, def string) string {
	if v, ok := a.m[k]; ok {
		return v
	}
	return def
}

func (a argMap) float(k string, def float64) float64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	if v == "unlimited" || v == "inf" {
		return math.Inf(1)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		a.t.Fatalf("%s=%s: %v", k, v, err)
	}
	return f
}

func (a argMap) int(k string, def int) int { return int(a.float(k, float64(def))) }

func (a argMap) bytes(k string, def int64) int64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	b, err := parseBytes(v)
	if err != nil {
		a.t.Fatalf("%s=%s: %v", k, v, err)
	}
	return b
}

func (a argMap) dur(k string, def int64) int64 {
	v, ok := a.m[k]
	if !ok {
		return def
	}
	ns, err := parseDur(v)
	if err != nil {
		a.t.Fatalf("%s=%s: %v", k, v, err)
	}
	return ns
}

func (a argMap) atLimit() AtLimit {
	if a.str("at-limit", "wait") == "allow" {
		return AllowWhenIdle
	}
	return Wait
}

func parseBytes(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		s string
		m int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"B", 1}} {
		if strings.HasSuffix(v, u.s) {
			v, mult = strings.TrimSuffix(v, u.s), u.m
			break
		}
	}
	n, err := strconv.ParseFloat(v, 64)
	return int64(n * float64(mult)), err
}

func parseDur(v string) (int64, error) {
	mult := 1.0
	for _, u := range []struct {
		s string
		m float64
	}{{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}} {
		if strings.HasSuffix(v, u.s) {
			v, mult = strings.TrimSuffix(v, u.s), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	return int64(f * mult), err
}
