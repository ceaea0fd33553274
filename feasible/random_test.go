package feasible_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"sluice/feasible"
)

// TestRandomLoads adds and removes random VMs on random hosts (fixed
// seeds) and checks after every step that the Load's packing, kept up
// incrementally, is the packer's fresh result (Assign) on the host's
// vNICs, and that Fits agrees with a fresh packing of the host's vNICs
// and the VM's. The vNICs are drawn from few sizes so that ties, pins,
// lost uplinks and misfits all occur.
func TestRandomLoads(t *testing.T) {
	fitsSeen, refusedSeen, misfitSeen := 0, 0, 0
	for seed := uint64(1); seed <= 400; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		c := feasible.Classes{Cap: 0.75, OtherBps: int64(rng.IntN(3)) * 500e6}
		h := feasible.Host{Name: "h"}
		for u := 0; u < 1+rng.IntN(3); u++ {
			h.Uplinks = append(h.Uplinks, c.Uplink(fmt.Sprintf("u%d", u), 10e9, rng.IntN(6) == 0))
		}
		var l feasible.Load
		var s feasible.Scratch
		on := map[int]*feasible.VM{}
		for step := 0; step < 60; step++ {
			name := fmt.Sprintf("seed %d step %d", seed, step)
			vi := rng.IntN(40)
			v := randomVM(rng, vi, len(h.Uplinks)+1)
			if old, ok := on[vi]; ok {
				l.Remove(&h, old)
				delete(on, vi)
			} else {
				fits := feasible.Fits(&h, &l, v, &s)
				nics := append(append([]feasible.NIC(nil), l.NICs...), v.NICs...)
				_, misfits := feasible.Assign(&h, nics)
				want := l.Misfits(&h) == 0 && misfits == 0
				for _, n := range v.NICs {
					if n.Uplink != "" && !up(&h, n.Uplink) {
						want = false
					}
				}
				if fits != want {
					t.Fatalf("%s: Fits %v, a fresh packing says %v (host vNICs %v, VM %v)", name, fits, want, l.NICs, v.NICs)
				}
				if fits != (len(feasible.Why(&h, &l, v, &s)) == 0) {
					t.Fatalf("%s: Fits %v disagrees with Why %v", name, fits, feasible.Why(&h, &l, v, &s))
				}
				if fits {
					fitsSeen++
				} else {
					refusedSeen++
				}
				if fits || rng.IntN(3) == 0 { // sometimes overload the host
					l.Add(&h, v)
					on[vi] = v
				}
			}
			at, misfits := feasible.Assign(&h, l.NICs)
			used := make([]int64, len(h.Uplinks))
			for i, j := range at {
				if j >= 0 {
					used[j] += l.NICs[i].ReservationBps
				}
			}
			if misfits != l.Misfits(&h) || fmt.Sprint(used) != fmt.Sprint(l.UsedBps(&h)) {
				t.Fatalf("%s: the load's packing %v (%d misfits), a fresh one %v (%d)", name, l.UsedBps(&h), l.Misfits(&h), used, misfits)
			}
			if misfits > 0 {
				misfitSeen++
			}
		}
	}
	if fitsSeen == 0 || refusedSeen == 0 || misfitSeen == 0 {
		t.Errorf("the draws never exercised a case: %d fits, %d refusals, %d steps with misfits", fitsSeen, refusedSeen, misfitSeen)
	}
}

func randomVM(rng *rand.Rand, vi, uplinks int) *feasible.VM {
	v := &feasible.VM{Name: fmt.Sprintf("v%d", vi), VCPUs: 1}
	for k := 0; k < rng.IntN(4); k++ {
		n := feasible.NIC{Name: fmt.Sprintf("n%d", k), ReservationBps: int64(rng.IntN(8)) * 1e9, VM: vi, Index: k}
		if rng.IntN(5) == 0 {
			n.Uplink = fmt.Sprintf("u%d", rng.IntN(uplinks))
		}
		v.NICs = append(v.NICs, n)
	}
	feasible.SortNICs(v.NICs)
	return v
}

func up(h *feasible.Host, name string) bool {
	for _, u := range h.Uplinks {
		if u.Name == name && !u.Down {
			return true
		}
	}
	return false
}
