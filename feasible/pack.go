package feasible

import "sort"

// The packer: each reserving vNIC's reservation lies whole on one uplink
// that is up, within the uplink's vm budget. vNICs are taken in packing
// order (Less: pinned first, then larger reservations, then file order),
// each to its pinned uplink, or else best fit: the uplink with the least
// budget left that still holds it (the first of equals). A vNIC that does
// not fit there is a misfit: it takes nothing in the pass, and after it
// goes (in order) to its pinned uplink if that is up, else to the uplink
// with the most budget left (the first of equals), so that every vNIC has
// an uplink to send by while its reservation is reported as not met.
//
// Placement judges a host by this packing (Fits, Holds) and the
// derivation uses its assignment (Assign), so the two agree on every
// host: a host that placement passes has every reservation on its uplink
// in the derived trees.

// bestFit is the uplink of h that n goes to given the reservations used
// so far, or -1 when none holds it.
func bestFit(h *Host, used []int64, n *NIC) int {
	best := -1
	var bestFree int64
	for j := range h.Uplinks {
		u := &h.Uplinks[j]
		if u.Down || (n.Uplink != "" && u.Name != n.Uplink) {
			continue
		}
		free := u.BudgetBps - used[j]
		if free >= n.ReservationBps && (best < 0 || free < bestFree) {
			best, bestFree = j, free
		}
	}
	return best
}

// mostFree is where misfit n goes: its pinned uplink if up, else the up
// uplink with the most budget left (the first of equals); -1 when no
// uplink is up.
func mostFree(h *Host, used []int64, n *NIC) int {
	if n.Uplink != "" {
		if j := upIndex(h, n.Uplink); j >= 0 {
			return j
		}
	}
	best := -1
	for j := range h.Uplinks {
		if !h.Uplinks[j].Down && (best < 0 || h.Uplinks[j].BudgetBps-used[j] > h.Uplinks[best].BudgetBps-used[best]) {
			best = j
		}
	}
	return best
}

// pack assigns nics[from:] (reserving vNICs in packing order) on top of
// at[:from] and used, and returns the misfits among them, which it then
// assigns by mostFree. at and used must have room for nics and h's
// uplinks.
func pack(h *Host, nics []NIC, from int, at []int, used []int64) int {
	misfits := 0
	for i := from; i < len(nics); i++ {
		n := &nics[i]
		j := bestFit(h, used, n)
		at[i] = j
		if j < 0 {
			misfits++
			continue
		}
		used[j] = add(used[j], n.ReservationBps)
	}
	if misfits == 0 {
		return 0
	}
	for i := from; i < len(nics); i++ {
		if at[i] < 0 {
			j := mostFree(h, used, &nics[i])
			at[i] = j
			if j >= 0 {
				used[j] = add(used[j], nics[i].ReservationBps)
			}
		}
	}
	return misfits
}

// Assign returns the uplink (an index into h.Uplinks, or -1 when none is
// up) of every vNIC of nics, in the order given, and how many reserving
// vNICs do not fit (see the packer's rule above). vNICs without a
// reservation go to their pinned uplink if it is up, else to the first
// uplink that is up.
func Assign(h *Host, nics []NIC) (at []int, misfits int) {
	at = make([]int, len(nics))
	var idx []int
	for i := range nics {
		if nics[i].ReservationBps > 0 {
			idx = append(idx, i)
			continue
		}
		at[i] = -1
		if nics[i].Uplink != "" {
			at[i] = upIndex(h, nics[i].Uplink)
		}
		if at[i] < 0 {
			at[i] = firstUp(h)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return Less(&nics[idx[a]], &nics[idx[b]]) })
	inOrder := make([]NIC, len(idx))
	for k, i := range idx {
		inOrder[k] = nics[i]
	}
	sat := make([]int, len(inOrder))
	misfits = pack(h, inOrder, 0, sat, make([]int64, len(h.Uplinks)))
	for k, i := range idx {
		at[i] = sat[k]
	}
	return at, misfits
}

func firstUp(h *Host) int {
	for j := range h.Uplinks {
		if !h.Uplinks[j].Down {
			return j
		}
	}
	return -1
}

// Room is the largest reservation one vNIC (pinned to pin, or "") can
// have on h with nothing else there: the vm budget of its pinned uplink,
// or the largest of an uplink that is up.
func Room(h *Host, pin string) int64 {
	return room(h, pin, func(u *Uplink) int64 { return u.BudgetBps })
}

// room is the largest budget (of each uplink, by budget) of an uplink of
// h that is up (pin's, when pin is not "").
func room(h *Host, pin string, budget func(u *Uplink) int64) int64 {
	var most int64
	for i := range h.Uplinks {
		u := &h.Uplinks[i]
		if !u.Down && (pin == "" || u.Name == pin) {
			most = max(most, budget(u))
		}
	}
	return most
}

// InRoom is the largest inbound reservation one vNIC (pinned to pin, or
// "") can have on h with nothing else there.
func InRoom(h *Host, pin string) int64 {
	return room(h, pin, func(u *Uplink) int64 { return u.InBudgetBps })
}
