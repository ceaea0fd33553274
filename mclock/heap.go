package mclock

// cheap is an intrusive binary min-heap of clients keyed by one of their
// tags (tag[kind]); each client records its position in idx[kind]. Ties go
// to the lower client id so that runs are deterministic.
type cheap struct {
	kind int
	a    []*client
}

func (h *cheap) less(i, j int) bool {
	x, y := h.a[i], h.a[j]
	tx, ty := x.tag[h.kind], y.tag[h.kind]
	if tx != ty {
		return tx < ty
	}
	return x.id < y.id
}

func (h *cheap) swap(i, j int) {
	h.a[i], h.a[j] = h.a[j], h.a[i]
	h.a[i].idx[h.kind] = int32(i)
	h.a[j].idx[h.kind] = int32(j)
}

func (h *cheap) push(c *client) {
	c.idx[h.kind] = int32(len(h.a))
	h.a = append(h.a, c)
	h.up(len(h.a) - 1)
}

func (h *cheap) remove(i int) {
	n := len(h.a) - 1
	c := h.a[i]
	if i != n {
		h.swap(i, n)
	}
	h.a[n] = nil
	h.a = h.a[:n]
	c.idx[h.kind] = -1
	if i != n {
		h.fix(i)
	}
}

func (h *cheap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *cheap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *cheap) down(i0 int) bool {
	i, n := i0, len(h.a)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
