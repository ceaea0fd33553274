package hclock

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// opsCmd drives the API directly and prints what each call returned.
func opsCmd(t *testing.T, tr *ttree, input string) string {
	s, err := New(tr.config())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	queuedAt := map[int][]int64{} // per port, the times of the packets it holds
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		var at int64
		if last := f[len(f)-1]; strings.HasPrefix(last, "@") {
			if at, err = parseDur(last[1:]); err != nil {
				t.Fatal(err)
			}
			f = f[:len(f)-1]
		}
		id := func(name string) int {
			i, ok := tr.idx[name]
			if !ok {
				return -1
			}
			return i
		}
		fmt.Fprintf(&b, "%s -> ", line)
		switch f[0] {
		case "enqueue":
			n, _ := strconv.Atoi(f[2])
			ok := s.Enqueue(id(f[1]), n, at)
			if ok {
				queuedAt[id(f[1])] = append(queuedAt[id(f[1])], at)
			}
			fmt.Fprintf(&b, "%v\n", ok)
		case "dequeue":
			p, ok, next := s.Dequeue(at)
			switch {
			case ok:
				by := "shares"
				if p.Phase == ByReservation {
					by = "reservation"
				}
				q := queuedAt[p.Port]
				fmt.Fprintf(&b, "%s %dB by %s (queued at %s)\n", s.Name(p.Port), p.Bytes, by, fmtDur(q[0]))
				queuedAt[p.Port] = q[1:]
			case next == Never:
				b.WriteString("nothing queued\n")
			default:
				fmt.Fprintf(&b, "nothing until %s\n", fmtDur(next))
			}
		case "set":
			m, _ := kv(f[2:])
			err := s.SetParams(id(f[1]), merge(s.Params(id(f[1])), setParams(t, Params{}, m)), at)
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
			} else {
				b.WriteString("ok\n")
			}
		case "stats":
			st := s.Stats(id(f[1]))
			fmt.Fprintf(&b, "sent %d pkts %dB (by reservation %dB), dropped %d pkts %dB, queued %d pkts %dB\n",
				st.SentPackets, st.SentBytes, st.ReservationBytes, st.DroppedPackets, st.DroppedBytes, st.QueuedPackets, st.QueuedBytes)
		default:
			t.Fatalf("unknown op %q", f[0])
		}
	}
	return b.String()
}
