package storage

import (
	"fmt"
	"math"
	"testing"
)

// simulate drives mclockSched against a datastore of capacity IOPS with a
// window of outstanding requests, every disk backlogged with depth requests
// (closed loop), for durNs; it returns the IOPS each disk got.
func simulate(disks []*mclockDisk, capacityIOPS float64, window, depth int, durNs int64) []float64 {
	s := &mclockSched{disks: disks}
	svcNs := int64(1e9 / capacityIOPS) // one server: a request completes every svcNs
	for i := range disks {
		for k := 0; k < depth; k++ {
			s.add(i, &op{disk: i, cost: 1}, 0)
		}
	}
	type inflight struct {
		o     *op
		endNs int64
	}
	var fl []inflight
	served := make([]float64, len(disks))
	now, busyUntil := int64(0), int64(0)
	for now < durNs {
		for len(fl) < window {
			o, ok, wait := s.next(now)
			if !ok {
				if wait > 0 && len(fl) == 0 {
					now = wait
					continue
				}
				break
			}
			busyUntil = max(busyUntil, now) + svcNs
			fl = append(fl, inflight{o, busyUntil})
		}
		// Complete the earliest request; its disk issues a new one at once.
		first := 0
		for i := range fl {
			if fl[i].endNs < fl[first].endNs {
				first = i
			}
		}
		f := fl[first]
		fl = append(fl[:first], fl[first+1:]...)
		now = max(now, f.endNs)
		served[f.o.disk]++
		s.add(f.o.disk, &op{disk: f.o.disk, cost: 1}, now)
	}
	for i := range served {
		served[i] /= float64(durNs) / 1e9
	}
	return served
}

func TestMclockFloorSemantics(t *testing.T) {
	for _, tc := range []struct {
		name  string
		disks []*mclockDisk
		want  []float64 // IOPS, from the floor water-filling of DESIGN.md §2
	}{
		{"shares 1:2", []*mclockDisk{{shares: 1000}, {shares: 2000}}, []float64{533.3, 1066.7}},
		{"limit", []*mclockDisk{{shares: 1000}, {shares: 1000, limitIOPS: 200}}, []float64{1400, 200}},
		{"reservation above share", []*mclockDisk{{shares: 2000}, {shares: 100, reservationIOPS: 300}}, []float64{1300, 300}},
		{"reservation below share", []*mclockDisk{{shares: 1000}, {shares: 1000, reservationIOPS: 300}}, []float64{800, 800}},
		{"all four", []*mclockDisk{{shares: 1000}, {shares: 2000}, {shares: 1000, limitIOPS: 200}, {shares: 100, reservationIOPS: 300}},
			[]float64{366.7, 733.3, 200, 300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := simulate(tc.disks, 1600, 16, 32, 20e9)
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 0.02*tc.want[i] {
					t.Errorf("disk %d: %.1f IOPS, want %.1f ± 2%% (all: %s)", i, got[i], tc.want[i], fmtIOPS(got))
				}
			}
		})
	}
}

func fmtIOPS(v []float64) string {
	s := ""
	for _, x := range v {
		s += fmt.Sprintf(" %.1f", x)
	}
	return s
}
