package storage

import (
	"fmt"
	"math"
	"testing"

	"sluice/mclock"
	"sluice/policy"
)

// simulate drives the scheduler the gateway builds (package mclock, one
// client per disk from mclockParams) against a datastore of capacityIOPS
// with window outstanding requests, every disk backlogged with depth
// requests (closed loop), for durNs; it returns the IOPS each disk got.
func simulate(disks []policy.Disk, capacityIOPS float64, window, depth int, durNs int64) []float64 {
	s := mclock.New(mclock.Config{LimitBurstNs: limitBurstNs})
	for i, d := range disks {
		if err := s.AddClient(i, mclockParams(d)); err != nil {
			panic(err)
		}
	}
	svcNs := int64(1e9 / capacityIOPS) // one server: a request completes every svcNs
	for i := range disks {
		for k := 0; k < depth; k++ {
			s.Add(i, mclock.Request{Bytes: 4096}, 0)
		}
	}
	type inflight struct {
		disk  int
		endNs int64
	}
	var fl []inflight
	served := make([]float64, len(disks))
	now, busyUntil := int64(0), int64(0)
	for now < durNs {
		for len(fl) < window {
			_, id, ok, wait := s.Pull(now)
			if !ok {
				if wait != mclock.Never && len(fl) == 0 {
					now = wait
					continue
				}
				break
			}
			busyUntil = max(busyUntil, now) + svcNs
			fl = append(fl, inflight{id, busyUntil})
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
		served[f.disk]++
		s.Add(f.disk, mclock.Request{Bytes: 4096}, now)
	}
	for i := range served {
		served[i] /= float64(durNs) / 1e9
	}
	return served
}

func TestSchedulerFloorSemantics(t *testing.T) {
	for _, tc := range []struct {
		name  string
		disks []policy.Disk
		want  []float64 // IOPS, from the floor water-filling of DESIGN.md §2
	}{
		{"shares 1:2", []policy.Disk{{Shares: 1000}, {Shares: 2000}}, []float64{533.3, 1066.7}},
		{"limit", []policy.Disk{{Shares: 1000}, {Shares: 1000, LimitIOPS: 200}}, []float64{1400, 200}},
		{"reservation above share", []policy.Disk{{Shares: 2000}, {Shares: 100, ReservationIOPS: 300}}, []float64{1300, 300}},
		{"reservation below share", []policy.Disk{{Shares: 1000}, {Shares: 1000, ReservationIOPS: 300}}, []float64{800, 800}},
		{"all four", []policy.Disk{{Shares: 1000}, {Shares: 2000}, {Shares: 1000, LimitIOPS: 200}, {Shares: 100, ReservationIOPS: 300}},
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
