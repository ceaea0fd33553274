package sim

// TxScheduler decides which port's head segment an uplink transmits next.
// It sees every segment as it is queued (Enqueue) and hands out one port
// per Dequeue; the uplink keeps the segments of each port in order.
// nextNs, when ok is false, is the earliest time a port becomes eligible
// (0 when no port is backlogged).
type TxScheduler interface {
	Enqueue(port int, bytes int64, nowNs int64)
	Dequeue(nowNs int64) (port int, ok bool, nextNs int64)
}

// fifoSched is the "default scheduler" of the seeds: one FIFO for the whole
// uplink, first queued, first sent, no notion of ports.
type fifoSched struct {
	ring []int
	head int
}

func (f *fifoSched) Enqueue(port int, _ int64, _ int64) { f.ring = append(f.ring, port) }

func (f *fifoSched) Dequeue(int64) (int, bool, int64) {
	if f.head == len(f.ring) {
		return 0, false, 0
	}
	p := f.ring[f.head]
	f.head++
	if f.head > 4096 && f.head*2 > len(f.ring) {
		f.ring = append(f.ring[:0], f.ring[f.head:]...)
		f.head = 0
	}
	return p, true, 0
}
