package placement

import (
	"math"
	"sort"
)

// Packing reserving vNICs onto uplinks: each vNIC's reservation lies whole
// on one uplink (the pinned one, if any), within the uplink's vm budget.
// Fresh packings are first fit decreasing with best fit; a VM joining a
// host is packed best fit on top of what is there, and the whole host is
// repacked only when that fails.

// nicRef names vNIC k of VM vi.
type nicRef struct{ vi, k int }

// nicLess is the packing order: pinned vNICs first, then larger
// reservations, then file order.
func (s *state) nicLess(a, b nicRef) bool {
	na, nb := &s.vms[a.vi].nics[a.k], &s.vms[b.vi].nics[b.k]
	if (na.pin != "") != (nb.pin != "") {
		return na.pin != ""
	}
	if na.resv != nb.resv {
		return na.resv > nb.resv
	}
	if a.vi != b.vi {
		return a.vi < b.vi
	}
	return a.k < b.k
}

// hostNICs returns the reserving vNICs of host hi's VMs in packing order,
// kept until the host's VMs change.
func (s *state) hostNICs(hi int) []nicRef {
	h := &s.hosts[hi]
	if h.nicOK {
		return h.nicList
	}
	h.nicList = h.nicList[:0]
	for _, vi := range h.vms {
		for k, n := range s.vms[vi].nics {
			if n.resv > 0 {
				h.nicList = append(h.nicList, nicRef{vi, k})
			}
		}
	}
	sort.Slice(h.nicList, func(a, b int) bool { return s.nicLess(h.nicList[a], h.nicList[b]) })
	h.nicOK = true
	return h.nicList
}

// packVM assigns the reserving vNICs of VM vi (already attached to hi) to
// uplinks of hi with free budget, best fit, pinned vNICs first. It returns
// false, assigning nothing, when they do not fit that way.
func (s *state) packVM(vi, hi int) bool {
	v, h := &s.vms[vi], &s.hosts[hi]
	if h.netBad {
		return false
	}
	order := nicOrder(v)
	for _, k := range order {
		n := v.nics[k]
		u := bestUplink(h, n)
		if u < 0 {
			for _, k2 := range order {
				if j := v.nicUp[k2]; j >= 0 {
					h.uplinks[j].used -= v.nics[k2].resv
					v.nicUp[k2] = -1
				}
			}
			return false
		}
		h.uplinks[u].used += n.resv
		v.nicUp[k] = u
	}
	return true
}

// nicOrder lists the reserving vNICs of v: pinned first, then larger
// reservations first, then in file order.
func nicOrder(v *vm) []int {
	var order []int
	for k, n := range v.nics {
		if n.resv > 0 {
			order = append(order, k)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		na, nb := v.nics[order[a]], v.nics[order[b]]
		if (na.pin != "") != (nb.pin != "") {
			return na.pin != ""
		}
		return na.resv > nb.resv
	})
	return order
}

// bestUplink is the up uplink of h with the least free budget that still
// holds n (the one it is pinned to, if any), or -1.
func bestUplink(h *host, n nicReq) int {
	best, bestFree := -1, math.Inf(1)
	for j := range h.uplinks {
		u := &h.uplinks[j]
		if u.down || (n.pin != "" && u.name != n.pin) {
			continue
		}
		free := u.budget - u.used
		if free+1e-6 >= n.resv && free < bestFree {
			best, bestFree = j, free
		}
	}
	return best
}

// repack assigns every reserving vNIC on host hi afresh (first fit
// decreasing, best fit), and records whether they all fit.
func (s *state) repack(hi int) {
	h := &s.hosts[hi]
	for j := range h.uplinks {
		h.uplinks[j].used = 0
	}
	for _, vi := range h.vms {
		for k := range s.vms[vi].nicUp {
			s.vms[vi].nicUp[k] = -1
		}
	}
	h.netBad = false
	for _, r := range s.hostNICs(hi) {
		n := s.vms[r.vi].nics[r.k]
		u := bestUplink(h, n)
		if u < 0 {
			h.netBad = true
			continue
		}
		h.uplinks[u].used += n.resv
		s.vms[r.vi].nicUp[r.k] = u
	}
}

// tryPack reports whether the reserving vNICs of VM vi can be added to host
// hi: best fit on top of the present assignment, else a fresh packing of
// the whole host. It works on scratch space and changes nothing.
func (s *state) tryPack(vi, hi int) bool {
	v, h := &s.vms[vi], &s.hosts[hi]
	free := s.scratchFree(h)
	order := nicOrder(v)
	ok := true
	for _, k := range order {
		if !takeUplink(h, free, v.nics[k]) {
			ok = false
			break
		}
	}
	if ok {
		return true
	}
	// A fresh packing of everything on the host, v included: merge the
	// host's list with v's, both in packing order.
	for j := range h.uplinks {
		free[j] = h.uplinks[j].budget
	}
	hl := s.hostNICs(hi)
	vl := make([]nicRef, 0, len(order))
	for _, k := range order {
		vl = append(vl, nicRef{vi, k})
	}
	sort.Slice(vl, func(a, b int) bool { return s.nicLess(vl[a], vl[b]) })
	i, j := 0, 0
	for i < len(hl) || j < len(vl) {
		var r nicRef
		if j >= len(vl) || (i < len(hl) && s.nicLess(hl[i], vl[j])) {
			r, i = hl[i], i+1
		} else {
			r, j = vl[j], j+1
		}
		if !takeUplink(h, free, s.vms[r.vi].nics[r.k]) {
			return false
		}
	}
	return true
}

// scratchFree returns the free budget of each uplink of h in scratch space.
func (s *state) scratchFree(h *host) []float64 {
	if cap(s.scratch) < len(h.uplinks) {
		s.scratch = make([]float64, len(h.uplinks))
	}
	free := s.scratch[:len(h.uplinks)]
	for j := range h.uplinks {
		free[j] = h.uplinks[j].budget - h.uplinks[j].used
	}
	return free
}

// takeUplink takes n's reservation from the best-fitting entry of free (an
// up uplink of h; the pinned one if n is pinned).
func takeUplink(h *host, free []float64, n nicReq) bool {
	best := -1
	for j := range h.uplinks {
		if h.uplinks[j].down || (n.pin != "" && h.uplinks[j].name != n.pin) {
			continue
		}
		if free[j]+1e-6 >= n.resv && (best < 0 || free[j] < free[best]) {
			best = j
		}
	}
	if best < 0 {
		return false
	}
	free[best] -= n.resv
	return true
}

// uplinkByName is the index of the up uplink of h called name, or -1.
func uplinkByName(h *host, name string) int {
	for j := range h.uplinks {
		if h.uplinks[j].name == name && !h.uplinks[j].down {
			return j
		}
	}
	return -1
}
