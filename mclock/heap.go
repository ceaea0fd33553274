package mclock

// cheap is an intrusive 4-ary min-heap of clients keyed by one of their
// tags (tag[kind]); each client records its position in idx[kind]. The key
// and id are copied into the heap so that sifting touches no client. Ties
// go to the lower client id so that runs are deterministic.
type cheap struct {
	kind int
	a    []hent
}

type hent struct {
	key int64
	id  int64
	c   *client
}

func (e *hent) less(f *hent) bool {
	return e.key < f.key || (e.key == f.key && e.id < f.id)
}

func (h *cheap) set(i int, e hent) {
	h.a[i] = e
	e.c.idx[h.kind] = int32(i)
}

func (h *cheap) push(c *client) {
	h.a = append(h.a, hent{})
	h.up(len(h.a)-1, hent{key: c.tag[h.kind], id: int64(c.id), c: c})
}

func (h *cheap) remove(i int) {
	n := len(h.a) - 1
	c := h.a[i].c
	last := h.a[n]
	h.a[n] = hent{}
	h.a = h.a[:n]
	c.idx[h.kind] = -1
	if i != n {
		h.place(i, last)
	}
}

// fix re-sorts position i after its client's tag changed.
func (h *cheap) fix(i int) {
	e := h.a[i]
	k := e.c.tag[h.kind]
	if k == e.key {
		return
	}
	e.key = k
	h.place(i, e)
}

// place puts e at hole i, moving it up or down as needed.
func (h *cheap) place(i int, e hent) {
	if i > 0 && e.less(&h.a[(i-1)/4]) {
		h.up(i, e)
	} else {
		h.down(i, e)
	}
}

func (h *cheap) up(j int, e hent) {
	for j > 0 {
		i := (j - 1) / 4
		if !e.less(&h.a[i]) {
			break
		}
		h.set(j, h.a[i])
		j = i
	}
	h.set(j, e)
}

func (h *cheap) down(i int, e hent) {
	n := len(h.a)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		end := min(c+4, n)
		for k := c + 1; k < end; k++ {
			if h.a[k].less(&h.a[m]) {
				m = k
			}
		}
		if !h.a[m].less(&e) {
			break
		}
		h.set(i, h.a[m])
		i = m
	}
	h.set(i, e)
}
