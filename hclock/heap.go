package hclock

import "math"

// entry is one heap element: a node id and its key (a tag in ns or in
// virtual bytes-per-share units). The key is kept next to the id so that
// sifting never touches the node array.
type entry struct {
	key float64
	id  int32
}

// iheap is an indexed 4-ary min-heap of node ids. pos[id] is the index of
// id in e, or -1 when id is not in this heap. One pos slice is shared by all
// heaps of the same kind (a node is a child of exactly one parent), so it is
// indexed by node id. All storage is preallocated: push never grows e past
// the capacity given at construction.
type iheap struct {
	e   []entry
	pos []int32
}

func (h *iheap) len() int { return len(h.e) }

// top returns the minimum entry; the heap must not be empty.
func (h *iheap) top() entry { return h.e[0] }

func (h *iheap) has(id int32) bool { return h.pos[id] >= 0 }

func (h *iheap) push(id int32, key float64) {
	i := len(h.e)
	h.e = append(h.e, entry{key, id})
	h.pos[id] = int32(i)
	h.up(i)
}

// pop removes and returns the minimum entry.
func (h *iheap) pop() entry {
	t := h.e[0]
	h.removeAt(0)
	return t
}

// remove takes id out of the heap if it is there.
func (h *iheap) remove(id int32) {
	if i := h.pos[id]; i >= 0 {
		h.removeAt(int(i))
	}
}

func (h *iheap) removeAt(i int) {
	last := len(h.e) - 1
	h.pos[h.e[i].id] = -1
	if i != last {
		h.e[i] = h.e[last]
		h.pos[h.e[i].id] = int32(i)
	}
	h.e[last] = pad
	h.e = h.e[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

// fix sets id's key and restores the heap order; id must be in the heap.
func (h *iheap) fix(id int32, key float64) {
	i := int(h.pos[id])
	old := h.e[i].key
	h.e[i].key = key
	switch {
	case key > old:
		h.sink(i)
	case key < old:
		h.up(i)
	}
}

func (h *iheap) up(i int) {
	e := h.e
	x := e[i]
	for i > 0 {
		p := (i - 1) / 4
		if !(x.key < e[p].key) {
			break
		}
		e[i] = e[p]
		h.pos[e[i].id] = int32(i)
		i = p
	}
	e[i] = x
	h.pos[x.id] = int32(i)
}

// down sifts element i towards the leaves and reports whether it moved.
func (h *iheap) down(i0 int) bool {
	e := h.e
	n := len(e)
	i := i0
	x := e[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m, mk := c, e[c].key
		end := min(c+4, n)
		for j := c + 1; j < end; j++ {
			if k := e[j].key; k < mk {
				m, mk = j, k
			}
		}
		if !(mk < x.key) {
			break
		}
		e[i] = e[m]
		h.pos[e[i].id] = int32(i)
		i = m
	}
	e[i] = x
	h.pos[x.id] = int32(i)
	return i > i0
}

// sink moves element i, whose key grew, down: it first walks the hole to
// a leaf along the smallest children (no comparison with x on the way),
// then lets x rise from there (Floyd). A served node's tag usually belongs
// near the bottom, so this saves a comparison per level. Every group of
// four siblings is read whole: past len(e) the storage holds +Inf keys (see
// carve and removeAt), so a partly filled last group needs no loop.
func (h *iheap) sink(i int) {
	e, pos := h.e, h.pos
	n := len(e)
	x := e[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		q := (*[4]entry)(e[c : c+4 : cap(e)]) // past len(e): pads
		m := least4(q)
		y := q[m]
		e[i] = y
		pos[y.id] = int32(i)
		i = c + m
	}
	for i > 0 {
		p := (i - 1) / 4
		y := e[p]
		if !(x.key < y.key) {
			break
		}
		e[i] = y
		pos[y.id] = int32(i)
		i = p
	}
	e[i] = x
	pos[x.id] = int32(i)
}

// raiseTop sets the key of the heap's top entry to key, which is not less
// than its old key, and restores the order: what Dequeue does to the child
// it just served (it was chosen as the top, so no position look-up).
func (h *iheap) raiseTop(key float64) {
	if key > h.e[0].key {
		h.e[0].key = key
		h.sink(0)
	}
}

// least4 is the index of the least of four keys (the first one on ties),
// found as a tournament of two independent pairs without branches: the
// outcome of a comparison is a coin toss in a heap of tags, and
// mispredicted branches are what sifting costs.
func least4(q *[4]entry) int {
	a := b2i(q[1].key < q[0].key)
	b := 2 + b2i(q[3].key < q[2].key)
	return a ^ (a^b)&-b2i(q[b&3].key < q[a&3].key)
}

// b2i is 1 for true and 0 for false; it compiles to a SETcc, not a branch.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pad fills a heap's storage past its length (see sink).
var pad = entry{key: math.Inf(1), id: -1}
