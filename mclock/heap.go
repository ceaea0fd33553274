package mclock

// cheap is an intrusive 4-ary min-heap of clients keyed by one of their
// tags; pos (indexed by client id) records each client's position. The key
// and id are stored in the heap (16 bytes an entry, so the four children
// of a node share a cache line or two) so that sifting touches no client.
// Ties go to the lower client id so that runs are deterministic.
type cheap struct {
	a   []hent
	pos []int32 // by client id: index in a, -1 when absent
}

type hent struct {
	key int64
	id  int64
}

func (e hent) less(f hent) bool {
	return e.key < f.key || (e.key == f.key && e.id < f.id)
}

func (h *cheap) push(id int, key int64) {
	h.a = append(h.a, hent{})
	h.up(len(h.a)-1, hent{key: key, id: int64(id)})
}

func (h *cheap) remove(i int) {
	a := h.a
	n := len(a) - 1
	h.pos[a[i].id] = -1
	last := a[n]
	h.a = a[:n]
	if i == n {
		return
	}
	if i > 0 && last.less(h.a[(i-1)/4]) {
		h.up(i, last)
		return
	}
	h.refill(i, last)
}

// refill fills hole i with e, where e is no smaller than the hole's
// parent (the last entry, just removed from the end): the hole moves down
// along the smallest children to a leaf, and e rises from there (Floyd's
// bottom-up sift: the last entry usually belongs near the bottom, so this
// saves comparing it with every level's smallest child). The smallest-child
// selection is written out here and in down on purpose: as a function it is
// not inlined (it has a loop) and costs a call per level on the hot path.
func (h *cheap) refill(i int, e hent) {
	a, pos := h.a, h.pos
	n := len(a)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		best := a[c]
		if c+3 < n {
			kids := a[c : c+4 : c+4]
			if kids[1].less(best) {
				m, best = c+1, kids[1]
			}
			if kids[2].less(best) {
				m, best = c+2, kids[2]
			}
			if kids[3].less(best) {
				m, best = c+3, kids[3]
			}
		} else {
			for k := c + 1; k < n; k++ {
				if a[k].less(best) {
					m, best = k, a[k]
				}
			}
		}
		a[i] = best
		pos[best.id] = int32(i)
		i = m
	}
	h.up(i, e)
}

// fix re-sorts position i after its key changed to key.
func (h *cheap) fix(i int, key int64) {
	e := h.a[i]
	if key == e.key {
		return
	}
	if key > e.key {
		e.key = key
		h.down(i, e)
		return
	}
	e.key = key
	h.up(i, e)
}

func (h *cheap) up(j int, e hent) {
	a, pos := h.a, h.pos
	for j > 0 {
		i := (j - 1) / 4
		p := a[i]
		if !e.less(p) {
			break
		}
		a[j] = p
		pos[p.id] = int32(j)
		j = i
	}
	a[j] = e
	pos[e.id] = int32(j)
}

func (h *cheap) down(i int, e hent) {
	a, pos := h.a, h.pos
	n := len(a)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		best := a[c]
		if c+3 < n {
			// Full node: no per-child bound checks.
			kids := a[c : c+4 : c+4]
			if kids[1].less(best) {
				m, best = c+1, kids[1]
			}
			if kids[2].less(best) {
				m, best = c+2, kids[2]
			}
			if kids[3].less(best) {
				m, best = c+3, kids[3]
			}
		} else {
			for k := c + 1; k < n; k++ {
				if a[k].less(best) {
					m, best = k, a[k]
				}
			}
		}
		if !best.less(e) {
			break
		}
		a[i] = best
		pos[best.id] = int32(i)
		i = m
	}
	a[i] = e
	pos[e.id] = int32(i)
}
