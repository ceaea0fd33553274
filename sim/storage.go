package sim

import "math"

// StorageSpec overrides storage model parameters (docs/sim.md).
type StorageSpec struct {
	TransferMBps float64 `yaml:"transferMBps"` // per slot, for bytes beyond the first 4 KiB
	HostQueue    int     `yaml:"hostQueue"`    // host window without SIOC
	Gamma        float64 `yaml:"gamma"`        // PARDA smoothing
	BetaPer1000  float64 `yaml:"betaPer1000"`  // PARDA β per 1000 active shares
}

// StorageParams are the storage model parameters.
type StorageParams struct {
	TransferMBps float64
	HostQueue    int
	Gamma        float64
	BetaPer1000  float64
}

// DefaultStorageParams: see docs/sim.md for their sources.
var DefaultStorageParams = StorageParams{TransferMBps: 60, HostQueue: 64, Gamma: 0.5, BetaPer1000: 1}

// ioReq is one I/O in flight.
type ioReq struct {
	disk  *diskState
	bytes int64
	t0Ns  int64 // issued by the VM
	dsNs  int64 // reached the datastore
	done  func()
}

// datastore is an array of slots parallel servers with a FIFO queue.
type datastore struct {
	s         *Sim
	name      string
	slots     int
	st4kNs    float64
	busy      int
	queue     []*ioReq
	sioc      bool
	threshNs  float64
	periodNs  int64
	hosts     []*hostQ
	latSum    float64 // normalised latency of the current period
	latCnt    float64
	lastLatNs float64
}

// serviceNs is the time one slot takes for an I/O of b bytes: the 4 KiB
// service time plus the transfer of the rest.
func (d *datastore) serviceNs(b int64) float64 {
	extra := math.Max(0, float64(b-4096))
	return d.st4kNs + extra/(d.s.st.TransferMBps*1e6)*1e9
}

func (d *datastore) arrive(q *ioReq) {
	q.dsNs = d.s.eng.NowNs()
	d.queue = append(d.queue, q)
	d.serve()
}

func (d *datastore) serve() {
	for d.busy < d.slots && len(d.queue) > 0 {
		q := d.queue[0]
		d.queue = d.queue[1:]
		d.busy++
		d.s.eng.After(int64(d.serviceNs(q.bytes)), func() {
			d.busy--
			now := d.s.eng.NowNs()
			// Size-normalised latency: the time beyond what the extra
			// transfer of a large I/O explains.
			lat := float64(now-q.dsNs) - (d.serviceNs(q.bytes) - d.st4kNs)
			d.latSum += lat
			d.latCnt++
			q.disk.host.outstanding--
			q.disk.complete(q, now)
			q.disk.host.dispatch()
			d.serve()
		})
	}
}

// control runs PARDA on every host at the end of a control period.
func (d *datastore) control() {
	if d.latCnt > 0 {
		d.lastLatNs = d.latSum / d.latCnt
	}
	d.latSum, d.latCnt = 0, 0
	for _, h := range d.hosts {
		if d.sioc {
			act := 0.0
			for _, dk := range h.disks {
				if dk.issued > 0 || len(dk.mc.queue) > 0 {
					act += dk.mc.shares
				}
				dk.issued = 0
			}
			if act > 0 {
				h.window = d.s.parda.update(h.window, d.threshNs, d.lastLatNs, act)
			}
		} else {
			h.window = float64(d.s.st.HostQueue)
		}
		h.dispatch()
	}
	d.s.eng.After(d.periodNs, d.control)
}

// hostQ is one host's queue to one datastore: a window of outstanding
// I/Os (set by PARDA when SIOC is on) fed by mClock over the host's disks.
type hostQ struct {
	s           *Sim
	name        string // HOST/DATASTORE
	ds          *datastore
	window      float64
	outstanding int
	mc          mclockQ
	disks       []*diskState
	wakeNs      int64
}

func (h *hostQ) dispatch() {
	for float64(h.outstanding) < math.Floor(h.window) {
		q, next := h.mc.pull(h.s.eng.NowNs())
		if q == nil {
			if next > 0 && (h.wakeNs <= h.s.eng.NowNs() || next < h.wakeNs) {
				h.wakeNs = next
				h.s.eng.At(next, h.dispatch)
			}
			return
		}
		h.outstanding++
		q.disk.issued++
		h.ds.arrive(q)
	}
}

// diskState is a VM's virtual disk.
type diskState struct {
	name   string
	host   *hostQ
	mc     *mcClient
	issued int
	iops   *Series
	lat    *Series
}

func (dk *diskState) submit(bytes int64, done func()) {
	q := &ioReq{disk: dk, bytes: bytes, t0Ns: dk.host.s.eng.NowNs(), done: done}
	dk.host.mc.add(dk.mc, q, q.t0Ns)
	dk.host.dispatch()
}

func (dk *diskState) complete(q *ioReq, nowNs int64) {
	dk.iops.add(1, 1)
	dk.lat.add(float64(nowNs-q.t0Ns)/1e6, 1)
	q.done()
}

// oltp is a DVD Store-like workload: users, each thinking (exponential,
// mean think) and then placing an order of iosPerOrder sequential I/Os.
type oltp struct {
	s       *Sim
	disk    *diskState
	users   int
	thinkNs int64
	ios     int
	ioBytes int64
	active  bool
	gen     int
	orders  *Series
	orderT  *Series
}

func (o *oltp) start() {
	o.active = true
	o.gen++
	for range o.users {
		o.user(o.gen)
	}
}

func (o *oltp) user(gen int) {
	if !o.active || gen != o.gen {
		return
	}
	think := int64(o.s.eng.Rand.ExpFloat64() * float64(o.thinkNs))
	o.s.eng.After(think, func() {
		if !o.active || gen != o.gen {
			return
		}
		t0 := o.s.eng.NowNs()
		left := o.ios
		var next func()
		next = func() {
			if left == 0 {
				o.orders.add(1, 1)
				o.orderT.add(float64(o.s.eng.NowNs()-t0)/1e6, 1)
				o.user(gen)
				return
			}
			left--
			o.disk.submit(o.ioBytes, next)
		}
		next()
	})
}

// iometer keeps outstanding I/Os of ioBytes in flight.
type iometer struct {
	disk        *diskState
	outstanding int
	ioBytes     int64
	active      bool
	gen         int
}

func (m *iometer) start() {
	m.active = true
	m.gen++
	g := m.gen
	for range m.outstanding {
		m.issue(g)
	}
}

func (m *iometer) issue(g int) {
	if !m.active || g != m.gen {
		return
	}
	m.disk.submit(m.ioBytes, func() { m.issue(g) })
}
