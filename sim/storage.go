package sim

import (
	"fmt"
	"math"

	"sluice/entitle"
	"sluice/mclock"
	"sluice/parda"
	"sluice/policy"
	"sluice/throttle"
)

// StorageSpec overrides storage model parameters (docs/sim.md).
type StorageSpec struct {
	TransferMBps float64 `yaml:"transferMBps"` // per slot, for bytes beyond the first 4 KiB (0: linear in size)
	HostQueue    int     `yaml:"hostQueue"`    // host window without SIOC
	Gamma        float64 `yaml:"gamma"`        // PARDA γ (0: package parda's default)
	BetaPerShare float64 `yaml:"betaPerShare"` // PARDA β per active share (0: package parda's default)
	// PerSlot gives every slot its own FIFO and sends each I/O to a slot
	// drawn at random (a random I/O lives on one spindle), instead of one
	// FIFO feeding whichever slot is free.
	PerSlot bool `yaml:"perSlot"`
	// Parda is the window law of SIOC datastores: "classic" (default,
	// parda.Controller.Update, as in the seed) or "scaled"
	// (parda.Controller.UpdateScaled, as the live gateway: latency settles
	// at the threshold).
	Parda string `yaml:"parda"`
}

// StorageParams are the storage model parameters.
type StorageParams struct {
	TransferMBps float64
	HostQueue    int
	Gamma        float64
	BetaPerShare float64
	PerSlot      bool
	Parda        string // PardaClassic ("" too) or PardaScaled
}

// The window laws of StorageSpec.Parda.
const (
	PardaClassic = "classic"
	PardaScaled  = "scaled"
)

// checkPardaLaw reports whether law is a known value of StorageSpec.Parda.
func checkPardaLaw(law string) error {
	switch law {
	case "", PardaClassic, PardaScaled:
		return nil
	}
	return fmt.Errorf("unknown law %q (classic, scaled)", law)
}

// DefaultStorageParams: see docs/sim.md for their sources.
var DefaultStorageParams = StorageParams{HostQueue: 32}

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
	s      *Sim
	name   string
	slots  int
	st4kNs float64
	busy   int
	queue  []*ioReq
	// slotQ and slotBusy are the per-slot FIFOs (PerSlot).
	slotQ      [][]*ioReq
	slotBusy   []bool
	sioc       bool
	siocPolicy policy.SIOC // the policy's PARDA settings (minWindow, maxWindow, gains)
	threshNs   float64
	periodNs   int64
	hosts      []*hostQ
	ctl        *parda.Controller
	size       parda.SizeModel
	// lastLatNs is the datastore-wide (size-normalised) latency of the
	// last control period.
	lastLatNs float64
	// driver is policy.DriverGateway (hosts, mclock, windows) or
	// policy.DriverThrottle (thosts: QEMU's throttles set by
	// throttle.Step; recs: the datastore's shared stats, a record per
	// host in thosts order).
	driver string
	thosts []*throttleHost
	recs   []parda.Record
	dks    []*diskState // every disk of the datastore, in the derivation's order
}

// serviceNs is the time one slot takes for an I/O of b bytes. By default
// (TransferMBps 0) it is the array's service time per 4 KiB times the
// number of 4 KiB blocks (DESIGN.md §4: "time per 4 KiB I/O"); with
// TransferMBps set, the 4 KiB time plus the transfer of the rest.
func (d *datastore) serviceNs(b int64) float64 {
	if d.s.st.TransferMBps <= 0 {
		return d.st4kNs * math.Max(1, float64(b)/4096)
	}
	extra := math.Max(0, float64(b-4096))
	return d.st4kNs + extra/(d.s.st.TransferMBps*1e6)*1e9
}

func (d *datastore) arrive(q *ioReq) {
	q.dsNs = d.s.eng.NowNs()
	if d.s.st.PerSlot {
		if d.slotQ == nil {
			d.slotQ, d.slotBusy = make([][]*ioReq, d.slots), make([]bool, d.slots)
		}
		i := d.s.eng.Rand.IntN(d.slots)
		d.slotQ[i] = append(d.slotQ[i], q)
		d.serveSlot(i)
		return
	}
	d.queue = append(d.queue, q)
	d.serve()
}

// serveSlot starts the head of slot i's FIFO if the slot is idle.
func (d *datastore) serveSlot(i int) {
	if d.slotBusy[i] || len(d.slotQ[i]) == 0 {
		return
	}
	q := d.slotQ[i][0]
	d.slotQ[i] = d.slotQ[i][1:]
	d.slotBusy[i] = true
	d.busy++
	d.s.eng.After(int64(d.serviceNs(q.bytes)), func() {
		d.slotBusy[i] = false
		d.busy--
		d.finish(q)
		d.serveSlot(i)
	})
}

// finish accounts a completed I/O and lets its host send more.
func (d *datastore) finish(q *ioReq) {
	now := d.s.eng.NowNs()
	if q.disk == nil || q.disk.host == nil {
		d.finishDirect(q, now) // the throttle driver's
		return
	}
	h := q.disk.host
	h.io.add(q, now)
	h.outstanding--
	h.slots.Note(now, h.outstanding, h.window)
	q.disk.complete(q, now)
	h.dispatch()
}

func (d *datastore) serve() {
	for d.busy < d.slots && len(d.queue) > 0 {
		q := d.queue[0]
		d.queue = d.queue[1:]
		d.busy++
		d.s.eng.After(int64(d.serviceNs(q.bytes)), func() {
			d.busy--
			d.finish(q)
			d.serve()
		})
	}
}

// control runs PARDA (package parda) on every host at the end of a
// control period: the datastore-wide latency from every host's report,
// then each host's window from its active shares (classic law), or from
// its active shares and the sums of active shares and windows of all
// active hosts (scaled law, StorageParams.Parda).
func (d *datastore) control() {
	reports := make([]parda.HostReport, 0, len(d.hosts))
	for _, h := range d.hosts {
		reports = h.io.take(reports)
	}
	d.lastLatNs = d.size.DatastoreLatency(reports)
	d.controller() // the policy's settings, as the gateway's
	// Active shares of every host, and their sums over the active hosts.
	act := make([]float64, len(d.hosts))
	var totalShares, totalWindow float64
	for i, h := range d.hosts {
		for _, dk := range h.disks {
			if dk.issued > 0 || dk.queued > 0 {
				act[i] += dk.shares
			}
			dk.issued = 0
		}
		if act[i] > 0 {
			totalShares += act[i]
			totalWindow += h.window
		}
	}
	for i, h := range d.hosts {
		switch {
		case !d.sioc:
			h.window = float64(d.s.st.HostQueue)
		case act[i] <= 0:
		case d.s.st.Parda == PardaScaled:
			h.window = d.ctl.Hold(h.window, d.ctl.UpdateScaled(h.window, d.lastLatNs, act[i], totalShares, totalWindow), h.peak)
		default:
			h.window = d.ctl.Hold(h.window, d.ctl.Update(h.window, d.lastLatNs, act[i]), h.peak)
		}
		h.peak = h.outstanding
		h.slots.Note(d.s.eng.NowNs(), h.outstanding, h.window)
		h.dispatch()
	}
	d.s.eng.After(d.periodNs, d.control)
}

// hostQ is one host's queue to one datastore: a window of outstanding
// I/Os (set by PARDA when SIOC is on) fed by package mclock over the
// host's disks.
type hostQ struct {
	s           *Sim
	name        string // HOST/DATASTORE
	ds          *datastore
	window      float64
	outstanding int
	slots       parda.Slots // how window bounds outstanding
	mc          *mclock.Scheduler
	disks       []*diskState
	reqs        map[uint64]*ioReq
	nextHandle  uint64
	wakeNs      int64
	io          arrayIO // the current control period's I/O at the array
	peak        int     // most I/Os outstanding at once
}

// arrayIO is a host's I/O at the array in a control period: what its
// report to the datastore's latency is made of.
type arrayIO struct{ ios, latSumNs, bytesSum float64 }

// add counts q, done at nowNs.
func (a *arrayIO) add(q *ioReq, nowNs int64) {
	a.ios++
	a.latSumNs += float64(nowNs - q.dsNs)
	a.bytesSum += float64(q.bytes)
}

// take appends the period's report to reports (none without I/O) and
// starts a new period.
func (a *arrayIO) take(reports []parda.HostReport) []parda.HostReport {
	if a.ios > 0 {
		reports = append(reports, parda.HostReport{IOs: a.ios, LatencyNs: a.latSumNs / a.ios, MeanBytes: a.bytesSum / a.ios})
	}
	*a = arrayIO{}
	return reports
}

func (h *hostQ) dispatch() {
	for {
		now := h.s.eng.NowNs()
		if !h.slots.Allow(now, h.outstanding, h.window) {
			return
		}
		req, id, ok, next := h.mc.Pull(now)
		if !ok {
			if next != mclock.Never && next > now && (h.wakeNs <= now || next < h.wakeNs) {
				h.wakeNs = next
				h.s.eng.At(next, h.dispatch)
			}
			return
		}
		q := h.reqs[req.Handle]
		delete(h.reqs, req.Handle)
		h.outstanding++
		h.slots.Note(now, h.outstanding, h.window)
		h.peak = max(h.peak, h.outstanding)
		dk := h.disks[id]
		dk.queued--
		dk.issued++
		h.ds.arrive(q)
	}
}

// diskState is a VM's virtual disk: one mclock client of its host's
// queue (gateway), or a disk behind its QEMU throttle (throttle driver).
type diskState struct {
	name   string
	host   *hostQ // gateway; nil under the throttle driver
	id     int
	params mclock.Params
	shares float64
	queued int
	issued int
	iops   *Series
	lat    *Series
	// spec is the disk's R/S/L (IOPS) now; specs its history (iops_error).
	spec  entitle.DiskSpec
	specs []specAt
	// The throttle driver's: the host's driver, QEMU's throttle and its
	// cumulative counters.
	th  *throttleHost
	tq  *qemuThrottle
	ctr throttle.Counters
}

func (dk *diskState) submit(bytes int64, done func()) {
	if dk.tq != nil {
		dk.tq.submit(&ioReq{disk: dk, bytes: bytes, t0Ns: dk.th.s.eng.NowNs(), done: done})
		return
	}
	h := dk.host
	q := &ioReq{disk: dk, bytes: bytes, t0Ns: h.s.eng.NowNs(), done: done}
	h.nextHandle++
	h.reqs[h.nextHandle] = q
	dk.queued++
	if err := h.mc.Add(dk.id, mclock.Request{Bytes: bytes, Handle: h.nextHandle}, q.t0Ns); err != nil {
		h.s.logf("disk %s: mclock Add: %v", dk.name, err)
	}
	h.dispatch()
}

func (dk *diskState) setParams(p mclock.Params) error {
	if dk.host != nil {
		if err := dk.host.mc.Update(dk.id, p); err != nil {
			return fmt.Errorf("disk %s: mclock Update: %w", dk.name, err)
		}
	}
	dk.params, dk.shares = p, p.Shares
	dk.spec.ReservationIOPS, dk.spec.Shares, dk.spec.LimitIOPS = p.ReservationIOPS, p.Shares, p.LimitIOPS
	dk.specs = append(dk.specs, specAt{atNs: dk.nowNs(), spec: dk.spec})
	if dk.th != nil {
		dk.th.ds.policyChanged()
	}
	return nil
}

// specAt is a disk's R/S/L from a time on.
type specAt struct {
	atNs int64
	spec entitle.DiskSpec
}

func (dk *diskState) nowNs() int64 {
	if dk.host != nil {
		return dk.host.s.eng.NowNs()
	}
	return dk.th.s.eng.NowNs()
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
