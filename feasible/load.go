package feasible

// Load is what the VMs on a host take of it: the sums the checks compare
// with the host's capacity, and the host's reserving vNICs with their
// packing on its uplinks (computed when needed and kept until the VMs
// change). The zero value is an empty host. A Load belongs to one Host:
// pass the same h to every method.
type Load struct {
	CPUMHz      int64 // CPU reservations (VM.ReservedMHz)
	MemoryBytes int64
	// PinnedCores counts the cores that latency-sensitive VMs take (one
	// per vCPU) on a host whose cores are modelled.
	PinnedCores int
	NetBps      int64 // vNIC reservations
	InBps       int64 // vNIC inbound reservations
	// Wide counts the VMs with more vCPUs than the host has cores.
	Wide int
	// NICs are the reserving vNICs of the VMs, in packing order.
	NICs []NIC
	// InNICs are the vNICs that reserve inbound bandwidth only (they
	// take no part in the packing; see inboundCheck).
	InNICs []NIC

	pk packing
}

// packing is the packer's result for Load.NICs.
type packing struct {
	valid   bool
	at      []int   // per vNIC of NICs: its uplink, -1 when none is up
	used    []int64 // per uplink: the reservations assigned to it
	misfits int
}

// packing returns the packing of l's vNICs on h, packing them if needed.
func (l *Load) packing(h *Host) *packing {
	pk := &l.pk
	if !pk.valid {
		pk.at = grow(pk.at, len(l.NICs))
		pk.used = grow(pk.used, len(h.Uplinks))
		clear(pk.used)
		pk.misfits = pack(h, l.NICs, 0, pk.at, pk.used)
		pk.valid = true
	}
	return pk
}

// Misfits is the number of reserving vNICs of l that do not fit on h's
// uplinks (0 when the network checks hold).
func (l *Load) Misfits(h *Host) int { return l.packing(h).misfits }

// UsedBps is what the packing assigns to each uplink of h (misfits
// included), indexed like h.Uplinks. The caller must not modify it.
func (l *Load) UsedBps(h *Host) []int64 { return l.packing(h).used }

// Add counts v on h. A vNIC that sorts after every vNIC of l is packed on
// top of l's packing (the same result as packing afresh); otherwise the
// packing is redone when next needed.
func (l *Load) Add(h *Host, v *VM) {
	l.CPUMHz = add(l.CPUMHz, v.ReservedMHz(h))
	if v.PinsOn(h) {
		l.PinnedCores += v.VCPUs
	}
	l.MemoryBytes = add(l.MemoryBytes, v.MemoryBytes)
	if wide(h, v) {
		l.Wide++
	}
	from := len(l.NICs)
	tail := true
	for _, n := range v.NICs {
		l.InBps = add(l.InBps, n.InReservationBps)
		if n.ReservationBps == 0 {
			if n.InReservationBps > 0 {
				l.InNICs = append(l.InNICs, n)
			}
			continue
		}
		l.NetBps = add(l.NetBps, n.ReservationBps)
		if len(l.NICs) > 0 && Less(&n, &l.NICs[len(l.NICs)-1]) {
			tail = false
		}
		l.NICs = append(l.NICs, n)
	}
	if from == len(l.NICs) {
		return
	}
	if !tail {
		SortNICs(l.NICs)
		l.pk.valid = false
		return
	}
	if pk := &l.pk; pk.valid && pk.misfits == 0 {
		pk.at = grow(pk.at, len(l.NICs))
		pk.misfits = pack(h, l.NICs, from, pk.at, pk.used)
	} else {
		pk.valid = false
	}
}

// Remove takes v, counted on h by Add, off it.
func (l *Load) Remove(h *Host, v *VM) {
	l.CPUMHz = sub(l.CPUMHz, v.ReservedMHz(h))
	if v.PinsOn(h) {
		l.PinnedCores -= v.VCPUs
	}
	l.MemoryBytes = sub(l.MemoryBytes, v.MemoryBytes)
	if wide(h, v) {
		l.Wide--
	}
	vm, some := -1, false
	for _, n := range v.NICs {
		l.InBps = sub(l.InBps, n.InReservationBps)
		if n.ReservationBps == 0 && n.InReservationBps > 0 {
			l.InNICs = dropVM(l.InNICs, n.VM)
		}
		if n.ReservationBps > 0 {
			l.NetBps = sub(l.NetBps, n.ReservationBps)
			vm, some = n.VM, true
		}
	}
	if !some {
		return
	}
	// v's vNICs at the end of the order leave the packing of the others
	// as it was; elsewhere, the packing is redone when next needed.
	pk := &l.pk
	keep := pk.valid && pk.misfits == 0
	k, tail := 0, true
	for i := range l.NICs {
		if l.NICs[i].VM == vm {
			if keep && pk.at[i] >= 0 {
				pk.used[pk.at[i]] = sub(pk.used[pk.at[i]], l.NICs[i].ReservationBps)
			}
			continue
		}
		if k != i {
			tail = false
		}
		l.NICs[k] = l.NICs[i]
		if keep {
			pk.at[k] = pk.at[i]
		}
		k++
	}
	l.NICs = l.NICs[:k]
	if keep && tail {
		pk.at = pk.at[:k]
	} else {
		pk.valid = false
	}
}

// dropVM returns nics without the vNICs of the VM at index vm (in place).
func dropVM(nics []NIC, vm int) []NIC {
	k := 0
	for _, n := range nics {
		if n.VM != vm {
			nics[k] = n
			k++
		}
	}
	return nics[:k]
}

// Scratch is reusable space for Fit and HoldsWithout, so that a placement
// pass that asks millions of times allocates nothing. The zero value is
// ready; a Scratch must not be shared between goroutines.
type Scratch struct {
	u    []int64
	nics []NIC
	load Load
}

func (s *Scratch) used(n int) []int64 {
	s.u = grow(s.u, n)
	return s.u
}

// fitsNICs reports whether the reserving vNICs of v pack with l's on h
// without a misfit (l having none): v's vNICs best fit on top of l's
// packing when they all sort after l's, else a fresh packing of both.
func (l *Load) fitsNICs(h *Host, v *VM, s *Scratch) bool {
	pk := l.packing(h)
	if pk.misfits > 0 {
		return false
	}
	used := s.used(len(h.Uplinks))
	first := -1
	for k := range v.NICs {
		if v.NICs[k].ReservationBps > 0 {
			first = k
			break
		}
	}
	if first < 0 {
		return true
	}
	if len(l.NICs) == 0 || !Less(&v.NICs[first], &l.NICs[len(l.NICs)-1]) {
		copy(used, pk.used)
		return takeAll(h, used, v.NICs)
	}
	clear(used)
	i := 0
	for k := range v.NICs {
		n := &v.NICs[k]
		if n.ReservationBps == 0 {
			continue
		}
		for ; i < len(l.NICs) && Less(&l.NICs[i], n); i++ {
			if !take(h, used, &l.NICs[i]) {
				return false
			}
		}
		if !take(h, used, n) {
			return false
		}
	}
	return takeAll(h, used, l.NICs[i:])
}

// take packs n on top of used (best fit), or reports that it is a misfit.
func take(h *Host, used []int64, n *NIC) bool {
	j := bestFit(h, used, n)
	if j < 0 {
		return false
	}
	used[j] = add(used[j], n.ReservationBps)
	return true
}

func takeAll(h *Host, used []int64, nics []NIC) bool {
	for k := range nics {
		if nics[k].ReservationBps > 0 && !take(h, used, &nics[k]) {
			return false
		}
	}
	return true
}

// Without returns l as it would be if v, counted in it, left: a Load in
// s, valid until s is used again. It changes nothing else.
func Without(h *Host, l *Load, v *VM, s *Scratch) *Load {
	t := &s.load
	t.CPUMHz, t.MemoryBytes, t.NetBps, t.Wide = sub(l.CPUMHz, v.ReservedMHz(h)), sub(l.MemoryBytes, v.MemoryBytes), sub(l.NetBps, v.NetBps()), l.Wide
	t.PinnedCores = l.PinnedCores
	if v.PinsOn(h) {
		t.PinnedCores -= v.VCPUs
	}
	t.InBps = sub(l.InBps, v.InBps())
	if wide(h, v) {
		t.Wide--
	}
	vm := -1
	for _, n := range v.NICs {
		if n.ReservationBps > 0 || n.InReservationBps > 0 {
			vm = n.VM
		}
	}
	t.InNICs = t.InNICs[:0]
	for _, n := range l.InNICs {
		if n.VM != vm {
			t.InNICs = append(t.InNICs, n)
		}
	}
	s.nics = s.nics[:0]
	for _, n := range l.NICs {
		if n.VM != vm {
			s.nics = append(s.nics, n)
		}
	}
	t.NICs = s.nics
	t.pk.valid = false
	return t
}

// add adds two non-negative quantities, saturating at Unlimited, so that
// no file can overflow a sum: a saturated sum fails every check.
func add(a, b int64) int64 {
	if a > Unlimited-b {
		return Unlimited
	}
	return a + b
}

// sub takes b, once added, off a; a saturated sum stays saturated (its
// true value is lost), which errs on the side of refusing.
func sub(a, b int64) int64 {
	if a == Unlimited {
		return a
	}
	return a - b
}

// grow returns s with length n, keeping its contents.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		ns := make([]T, n, n+n/2)
		copy(ns, s)
		return ns
	}
	return s[:n]
}
