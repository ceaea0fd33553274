package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"sluice/internal/clock"
	"sluice/internal/inputfile"
	"sluice/mclock"
	"sluice/policy"
	"sluice/storage/nbd"
)

// Options configure a Gateway.
type Options struct {
	// Host is the policy host this gateway runs on; it exports the disks of
	// the VMs placed on it.
	Host   string
	Policy *policy.Policy
	// Datastores maps a datastore name to where it is: a directory of
	// volumes ("dir:PATH" or an absolute PATH, e.g. an NFS mount) or an NBD
	// server with one export per volume ("nbd://IP:PORT" or
	// "nbd+unix:///?socket=PATH"). Every datastore holding a disk of this
	// host must be given.
	Datastores map[string]string
	// Period is the control period (default: the datastore's SIOC control
	// period, else 4 s).
	Period time.Duration
	// StatusFile receives the Status as JSON after every period ("" : none).
	StatusFile string
	// OnPeriod, if set, is called with the Status after every period.
	OnPeriod func(Status)
	// Log receives each notable event with its level; nil: Logf gets it
	// as a line "gateway: MESSAGE" (nil too: silent). The NBD server's
	// lines (protocol violations, refused and closed connections) go to
	// Log as warnings.
	Log  *slog.Logger
	Logf func(format string, args ...any)
	// Clock is the source of time for the control period, the schedulers'
	// tags and latency measurement (nil: real time).
	Clock clock.Clock
	// PollNs, if > 0, turns on bounded busy polling at queue depth 1: after
	// a reply to a VM with nothing else in flight on that connection the
	// gateway polls the VM's socket for up to PollNs for its next request,
	// and after a request to the datastore with nothing else in flight it
	// polls the datastore socket for up to PollNs for the reply, before
	// parking. CPU for
	// latency: each poll saves a thread wake-up when the answer comes
	// within PollNs (docs/perf/storage.md).
	PollNs int64
	// MaxConns bounds the VM connections open at once over all listeners
	// (default nbd.DefaultMaxConns); MaxConnsPerVM those on one VM's
	// socket (default DefaultMaxConnsPerVM).
	MaxConns, MaxConnsPerVM int
}

// Gateway serves the disks of one host and controls their I/O.
type Gateway struct {
	opts    Options
	clk     clock.Clock
	gates   []*datastoreGate
	exports *exportSet
	srv     *nbd.Server

	polMu  sync.Mutex // serialises SetPolicy
	mu     sync.Mutex
	pol    *policy.Policy
	status Status
	listen string
	stop   chan struct{} // closed (under mu) when Close begins
	wg     sync.WaitGroup
	once   sync.Once

	closeOnce sync.Once
	closeErr  error
}

// logAt reports one notable event: to Options.Log at level, else to
// Options.Logf as "gateway: MESSAGE".
func (g *Gateway) logAt(level slog.Level, format string, args ...any) {
	if g.opts.Log != nil {
		g.opts.Log.Log(context.Background(), level, fmt.Sprintf(format, args...))
		return
	}
	g.opts.Logf("gateway: "+format, args...)
}

// exportSet is the gateway's exports, changed while it serves (VMs arrive
// and leave).
type exportSet struct {
	mu sync.RWMutex
	m  map[string]*disk
}

// Export implements nbd.Exports.
func (e *exportSet) Export(name string) (nbd.Backend, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	d, ok := e.m[name]
	return d, ok
}

// Names implements nbd.Exports.
func (e *exportSet) Names() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	n := make([]string, 0, len(e.m))
	for k := range e.m {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// New opens the datastores and the volumes of this host's disks; it serves
// nothing until Serve. A missing or too small volume is an error naming it.
func New(opts Options) (*Gateway, error) {
	p := opts.Policy
	if p == nil {
		return nil, errors.New("gateway: no policy")
	}
	if !hasHost(p, opts.Host) {
		return nil, fmt.Errorf("gateway: host %q is not in the policy", opts.Host)
	}
	g := &Gateway{opts: opts, clk: opts.Clock, exports: &exportSet{m: map[string]*disk{}}, stop: make(chan struct{}), pol: p}
	if g.clk == nil {
		g.clk = clock.Real
	}
	if g.opts.Logf == nil {
		g.opts.Logf = func(string, ...any) {}
	}
	for name := range opts.Datastores {
		if _, ok := dsByName(p, name); !ok {
			return nil, fmt.Errorf("gateway: --datastore %s: no such datastore in the policy", name)
		}
	}
	for _, ds := range p.Datastores {
		loc, ok := opts.Datastores[ds.Name]
		if !ok {
			continue
		}
		gate, err := newGate(g.clk, ds, loc, opts.PollNs)
		if err != nil {
			g.closeGates()
			return nil, err
		}
		g.gates = append(g.gates, gate)
	}
	if err := g.reconcile(p, true); err != nil {
		g.closeGates()
		return nil, err
	}
	nbdLogf := g.opts.Logf
	if g.opts.Log != nil {
		nbdLogf = func(format string, args ...any) { g.opts.Log.Warn(fmt.Sprintf(format, args...)) }
	}
	g.srv = &nbd.Server{Exports: g.exports, Logf: nbdLogf, PollNs: opts.PollNs, MaxConns: opts.MaxConns}
	g.status = g.snapshot(g.clk.Now(), nil)
	return g, nil
}

func hasHost(p *policy.Policy, host string) bool {
	for _, h := range p.Hosts {
		if h.Name == host {
			return true
		}
	}
	return false
}

func dsByName(p *policy.Policy, name string) (policy.Datastore, bool) {
	for _, d := range p.Datastores {
		if d.Name == name {
			return d, true
		}
	}
	return policy.Datastore{}, false
}

// wanted are the disks of p's VMs on host, by export name, with their
// volumes: what host's gateway serves.
func wanted(p *policy.Policy, host string) (map[string]policy.Disk, map[string]Volume) {
	want := map[string]policy.Disk{}
	vols := map[string]Volume{}
	for _, vm := range p.VMs {
		if vm.Host != host {
			continue
		}
		for _, d := range vm.Disks {
			// A datastore whose file says throttle is the throttle
			// driver's (QEMU's own throttle, no gateway): the gateway
			// serves only volumes it made (policy.Datastore.DriverAt).
			if ds := p.Datastore(d.Datastore); ds != nil && ds.DriverAt(true) != policy.DriverGateway {
				continue
			}
			v := Volume{VM: vm.Name, Disk: d.Name, SizeBytes: DiskBytes(d)}
			want[v.Export()] = d
			vols[v.Export()] = v
		}
	}
	return want, vols
}

// HostDisk is a disk a host's gateway serves for a policy: its export
// (VM/DISK), datastore, size and scheduler parameters.
type HostDisk struct {
	Export, Datastore string
	SizeBytes         uint64
	Params            mclock.Params
}

// HostDisks lists the disks host's gateway serves for p, in export order.
func HostDisks(p *policy.Policy, host string) []HostDisk {
	want, vols := wanted(p, host)
	out := make([]HostDisk, 0, len(want))
	for name, d := range want {
		out = append(out, HostDisk{Export: name, Datastore: d.Datastore, SizeBytes: vols[name].SizeBytes, Params: mclockParams(d)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Export < out[j].Export })
	return out
}

// mclockParams are a disk's scheduler settings from the policy.
func mclockParams(d policy.Disk) mclock.Params {
	m := mclock.Params{Shares: float64(max(d.Shares, 1))}
	if d.ReservationIOPS > 0 {
		m.ReservationIOPS = float64(d.ReservationIOPS)
	}
	if d.LimitIOPS > 0 && d.LimitIOPS != policy.UnlimitedIOPS {
		m.LimitIOPS = float64(d.LimitIOPS)
	}
	return m
}

// newGate opens datastore ds at loc and its stats volume, and learns the
// datastore's identity.
func newGate(clk clock.Clock, ds policy.Datastore, loc string, pollNs int64) (*datastoreGate, error) {
	st, err := openStore(clk, loc, pollNs)
	if err != nil {
		return nil, fmt.Errorf("gateway: datastore %s: %w", ds.Name, err)
	}
	g := &datastoreGate{clk: clk, name: ds.Name, ds: ds, st: st, window: uncontrolledWindow, slot: -1, scan: minScan,
		sched: mclock.New(mclock.Config{LimitBurstNs: limitBurstNs}), ops: map[uint64]*op{}, disks: map[int]*disk{}}
	var id datastoreID
	stats, err := st.open(StatsVolume, func(c *nbd.Client) error {
		hdr := alignedBuf(statsHeaderBytes)
		if err := c.ReadAt(hdr, 0); err != nil {
			return err
		}
		return sameDatastore(id, hdr)
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: datastore %s: %w", ds.Name, err)
	}
	g.stats = stats
	if v, ok := stats.(*nbdVolume); ok {
		// The control loop reads and writes the stats volume once a
		// period: a datastore that does not answer (after one new
		// connection) makes a period without the datastore-wide view,
		// logged, and the next period tries again. Retrying for the
		// disks' retry window instead would stall the loop, and the
		// host's status with it, for the whole outage. A disk's
		// reconnection reads the identity here once the datastore
		// answered it.
		v.up.retryWindow = 0
	}
	if stats.sizeBytes() < statsHeaderBytes+StatsSlotBytes {
		stats.close()
		return nil, fmt.Errorf("gateway: datastore %s: stats volume %s has %d bytes, want %d", ds.Name, StatsVolume, stats.sizeBytes(), StatsVolumeBytes)
	}
	hdr := alignedBuf(statsHeaderBytes)
	if err := stats.readAt(hdr, 0); err != nil {
		stats.close()
		return nil, fmt.Errorf("gateway: datastore %s: stats volume: %w", ds.Name, err)
	}
	var ok bool
	if id, ok = decodeHeader(hdr); !ok {
		stats.close()
		return nil, fmt.Errorf("gateway: datastore %s: %s on %s has no datastore identity (prepare the datastore with sluice datastore create)", ds.Name, StatsVolume, st)
	}
	g.id = id
	if ds.SIOC.Enabled {
		g.parda = pardaController(ds.SIOC)
		g.window = initialWindow(g.parda)
	}
	return g, nil
}

// sameDatastore checks that a stats header holds identity id.
func sameDatastore(id datastoreID, hdr []byte) error {
	got, ok := decodeHeader(hdr)
	switch {
	case !ok:
		return fmt.Errorf("the datastore lost its identity (%s is empty or overwritten): it came back empty or was replaced", StatsVolume)
	case got != id:
		return fmt.Errorf("the datastore's identity changed from %s to %s: it was replaced", id, got)
	}
	return nil
}

// checkIdentity reads the datastore's identity again and fails the gate
// when it is not the one read at start.
func (gt *datastoreGate) checkIdentity() error {
	hdr := alignedBuf(statsHeaderBytes)
	err := gt.stats.readAt(hdr, 0)
	if err == nil {
		err = sameDatastore(gt.id, hdr)
	}
	if err != nil {
		gt.fail(err)
	}
	return err
}

// fail makes every later request of the gate's disks fail with EIO.
func (gt *datastoreGate) fail(err error) {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	if gt.failed == nil {
		gt.failed = err
	}
}

func (g *Gateway) closeGates() {
	for _, gt := range g.gates {
		gt.mu.Lock()
		ds := make([]*disk, 0, len(gt.disks))
		for _, d := range gt.disks {
			ds = append(ds, d)
		}
		gt.mu.Unlock()
		for _, d := range ds {
			d.vol.close()
		}
		gt.stats.close()
	}
}

func (g *Gateway) gate(ds string) *datastoreGate {
	for _, gt := range g.gates {
		if gt.name == ds {
			return gt
		}
	}
	return nil
}

// SetPolicy makes the gateway serve the disks p places on its host: disks
// of VMs that arrived are opened and exported, disks of VMs that left are
// drained, flushed and closed, the others take their new settings. Nothing
// moves on the datastore: a disk's volume is found by its name, so VMs
// and hosts may come and go in any order. Disks that cannot be opened are
// reported in the error; the other changes are made.
func (g *Gateway) SetPolicy(p *policy.Policy) error {
	if !hasHost(p, g.opts.Host) {
		return fmt.Errorf("gateway: host %q is not in the policy", g.opts.Host)
	}
	select {
	case <-g.stop:
		return errors.New("gateway: closed")
	default:
	}
	return g.reconcile(p, false)
}

// reconcile brings the exports in line with p. At start (first) any error
// fails.
func (g *Gateway) reconcile(p *policy.Policy, first bool) error {
	g.polMu.Lock()
	defer g.polMu.Unlock()
	want, wantVol := wanted(p, g.opts.Host)
	var errs []error
	// Disks that left, or whose datastore or size changed.
	g.exports.mu.RLock()
	var gone []*disk
	for name, d := range g.exports.m {
		pd, ok := want[name]
		if !ok || pd.Datastore != d.policy.Datastore || DiskBytes(pd) != d.v.SizeBytes {
			gone = append(gone, d)
		}
	}
	g.exports.mu.RUnlock()
	for _, d := range gone {
		g.removeDisk(d)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		pd := want[name]
		if d, ok := g.exports.Export(name); ok {
			d := d.(*disk)
			gt := d.gate
			gt.mu.Lock()
			var err error
			if mclockParams(d.policy) != mclockParams(pd) {
				err = gt.sched.Update(d.id, mclockParams(pd))
			}
			if err == nil {
				d.policy = pd
			}
			gt.mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("gateway: disk %s: %w", name, err))
			}
			continue
		}
		gt := g.gate(pd.Datastore)
		if gt == nil {
			errs = append(errs, fmt.Errorf("gateway: datastore %s: no --datastore %s=LOCATION given (disk %s)", pd.Datastore, pd.Datastore, name))
			continue
		}
		if err := g.addDisk(gt, wantVol[name], pd); err != nil {
			errs = append(errs, err)
		} else if !first {
			g.logAt(slog.LevelInfo, "serving %s (volume %s on %s)", name, wantVol[name].Name(), gt.st)
		}
	}
	g.mu.Lock()
	g.pol = p
	g.mu.Unlock()
	return errors.Join(errs...)
}

// addDisk opens disk v's volume on gt and exports it.
func (g *Gateway) addDisk(gt *datastoreGate, v Volume, pd policy.Disk) error {
	d := &disk{gate: gt, v: v, policy: pd}
	vol, err := gt.st.open(v.Name(), func(*nbd.Client) error {
		if err := gt.checkIdentity(); err != nil {
			return err
		}
		d.connectionReplaced()
		return nil
	})
	if err != nil {
		return fmt.Errorf("gateway: disk %s on datastore %s: %w", v.Export(), gt.name, err)
	}
	if vol.sizeBytes() < v.SizeBytes {
		vol.close()
		return fmt.Errorf("gateway: disk %s on datastore %s: volume %s has %d bytes, the disk needs %d", v.Export(), gt.name, v.Name(), vol.sizeBytes(), v.SizeBytes)
	}
	if fv, ok := vol.(*fileVolume); ok && !fv.direct {
		g.logAt(slog.LevelWarn, "disk %s: the file system of volume %s refuses O_DIRECT: served through this host's page cache, which no other host sees", v.Export(), v.Name())
	}
	d.vol = vol
	gt.mu.Lock()
	d.id = gt.nextID
	gt.nextID++
	err = gt.sched.AddClient(d.id, mclockParams(pd))
	if err == nil {
		gt.disks[d.id] = d
	}
	gt.mu.Unlock()
	if err != nil {
		vol.close()
		return fmt.Errorf("gateway: disk %s: %w", v.Export(), err)
	}
	g.exports.mu.Lock()
	g.exports.m[v.Export()] = d
	g.exports.mu.Unlock()
	return nil
}

// removeDrain is how long release waits for a leaving disk's requests.
var removeDrain = 30 * time.Second

// removeDisk stops exporting d: no new connection may open it. The
// connections that have it open are served until they end, as the source
// QEMU of a live migration keeps using its disks until the migration
// completes (both hosts serve the volume meanwhile: a directory
// datastore's volumes bypass the page cache, an NBD datastore is one
// server); then release flushes and closes the volume.
func (g *Gateway) removeDisk(d *disk) {
	g.exports.mu.Lock()
	delete(g.exports.m, d.v.Export())
	g.exports.mu.Unlock()
	gt := d.gate
	gt.mu.Lock()
	d.idle = make(chan struct{})
	conns := d.conns
	if conns == 0 {
		close(d.idle)
	}
	gt.mu.Unlock()
	g.mu.Lock()
	select {
	case <-g.stop:
		conns = 0 // Close began: released at once
	default:
	}
	if conns == 0 {
		g.mu.Unlock()
		g.release(d)
		return
	}
	g.wg.Add(1)
	g.mu.Unlock()
	g.logAt(slog.LevelInfo, "disk %s left this host: served to its %d open connection(s) until they close", d.v.Export(), conns)
	go func() {
		defer g.wg.Done()
		select {
		case <-d.idle:
		case <-g.stop:
		}
		g.release(d)
	}()
}

// release lets the leaving disk d go: its requests finish (for up to
// removeDrain; the rest fail), its volume is flushed and closed, so that
// the gateway of its VM's new host finds every acknowledged write.
func (g *Gateway) release(d *disk) {
	gt := d.gate
	gt.mu.Lock()
	d.removed = true
	gt.mu.Unlock()
	deadline := time.Now().Add(removeDrain)
	for {
		gt.mu.Lock()
		busy := d.queued + d.inflight
		gt.mu.Unlock()
		if busy == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // draining the disk's requests
	}
	gt.mu.Lock()
	var dropped []*op
	for h, o := range gt.ops {
		if o.disk == d {
			o.err = &nbd.Error{Errno: nbd.ESHUTDOWN}
			dropped = append(dropped, o)
			delete(gt.ops, h)
			d.queued--
		}
	}
	_, _ = gt.sched.RemoveClient(d.id)
	delete(gt.disks, d.id)
	gt.mu.Unlock()
	startAll(dropped)
	if err := d.vol.flush(); err != nil {
		g.logAt(slog.LevelError, "disk %s left: flush of volume %s: %v", d.v.Export(), d.v.Name(), err)
	}
	d.vol.close()
	g.logAt(slog.LevelInfo, "disk %s no longer served here", d.v.Export())
}

// Exports lists the export names ("VM/DISK") this gateway serves.
func (g *Gateway) Exports() []string { return g.exports.Names() }

// Serve starts the control loop and serves NBD on l until Close; every
// client on l may open every disk (the administrator's socket).
func (g *Gateway) Serve(l net.Listener) error { return g.ServeAccess(l, nbd.Access{}) }

// ServeAccess starts the control loop and serves NBD on l until Close;
// clients on l may do what a allows. It may run for several listeners at
// once; the Status lists them all.
func (g *Gateway) ServeAccess(l net.Listener, a nbd.Access) error {
	return g.serveNamed(l, a, listenName(l))
}

// serveNamed is ServeAccess with the listener's name in the Status (names
// listed once).
func (g *Gateway) serveNamed(l net.Listener, a nbd.Access, name string) error {
	g.mu.Lock()
	if !slices.Contains(strings.Fields(g.listen), name) {
		g.listen = strings.TrimSpace(g.listen + " " + name)
	}
	g.mu.Unlock()
	g.once.Do(func() {
		g.wg.Add(1)
		go g.controlLoop()
	})
	return g.srv.ServeAccess(l, a)
}

// closeGrace is how long Close waits for requests in flight at the
// datastore before it fails them.
var closeGrace = 10 * time.Second

// Close stops serving, fails queued requests and closes the datastore
// connections. Requests already at the datastore may finish for up to
// closeGrace; then they fail too. Every call returns after the gateway has
// stopped.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		close(g.stop)
		g.mu.Unlock()
		// Connections go first: clients see a closed connection (and
		// reconnect), not errors; requests already taken finish upstream.
		srvClosed := make(chan error, 1)
		go func() { srvClosed <- g.srv.Close() }()
		graceOver := make(chan struct{})
		stopGrace := g.clk.AfterFunc(closeGrace, func() { close(graceOver) })
		select {
		case g.closeErr = <-srvClosed:
		case <-graceOver:
			// A datastore that does not answer: fail what is still in
			// flight upstream. Its clients saw their connection close
			// without a reply, so nothing acknowledged is lost.
			g.logAt(slog.LevelWarn, "requests still at the datastore %v after close; aborting them", closeGrace)
			for _, gt := range g.gates {
				gt.mu.Lock()
				for _, d := range gt.disks {
					d.vol.abort()
				}
				gt.mu.Unlock()
			}
			g.closeErr = <-srvClosed
		}
		stopGrace()
		for _, gt := range g.gates {
			gt.mu.Lock()
			gt.closed = true
			gt.mu.Unlock()
		}
		g.wg.Wait()
		g.closeGates()
	})
	return g.closeErr
}

// Status returns the measurements of the last complete period, with the
// errors of datastores and disks as they are now.
func (g *Gateway) Status() Status {
	g.mu.Lock()
	st := g.status
	st.Listen = g.listen // the listeners serving now
	g.mu.Unlock()
	st.Datastores = append([]DatastoreStatus(nil), st.Datastores...)
	st.Disks = append([]DiskStatus(nil), st.Disks...)
	for _, gt := range g.gates {
		gt.mu.Lock()
		for i := range st.Datastores {
			if st.Datastores[i].Name == gt.name && gt.failed != nil {
				st.Datastores[i].Error = gt.failed.Error()
			}
		}
		for _, d := range gt.disks {
			for i := range st.Disks {
				if st.Disks[i].Disk == d.v.Export() && d.lost != nil {
					st.Disks[i].Error = d.lost.Error()
				}
			}
		}
		gt.mu.Unlock()
	}
	return st
}

func (g *Gateway) period() time.Duration {
	if g.opts.Period > 0 {
		return g.opts.Period
	}
	for _, gt := range g.gates {
		return gt.ds.SIOC.ControlPeriod // the policy's: its default is applied at load
	}
	return policy.DefaultControlPeriod
}

func (g *Gateway) controlLoop() {
	defer g.wg.Done()
	per := g.period()
	tick, stopTicker := g.clk.NewTicker(per)
	defer stopTicker()
	last := g.clk.Now()
	for {
		select {
		case <-g.stop:
			return
		case now := <-tick:
			st := g.closePeriod(now, now.Sub(last))
			last = now
			g.mu.Lock()
			g.status = st
			g.mu.Unlock()
			if g.opts.StatusFile != "" {
				if err := writeStatusFile(g.opts.StatusFile, st); err != nil {
					g.logAt(slog.LevelError, "status file: %v", err)
				}
			}
			if g.opts.OnPeriod != nil {
				g.opts.OnPeriod(st)
			}
		}
	}
}

// periodResult is what one control period measured on one datastore.
type periodResult struct {
	dsLatNs, hostLatNs, hostIOPS, activeShares float64
	hosts                                      int
	diskStats                                  map[int]diskPeriod
	diskOutstanding                            map[int]int
	diskQueued                                 map[int]int // waiting in the gateway at the period's end
}

// closePeriod ends the period on every datastore: it takes the period's
// counters, reads the datastore's identity and the hosts' records from the
// stats volume, lets pardaStep decide the new window, publishes this
// host's record in its slot and applies the window.
func (g *Gateway) closePeriod(now time.Time, elapsed time.Duration) Status {
	res := make([]periodResult, len(g.gates))
	for i, gt := range g.gates {
		gt.mu.Lock()
		per := gt.period
		gt.period = dsPeriod{peak: gt.outstanding}
		r := periodResult{diskStats: map[int]diskPeriod{}, diskOutstanding: map[int]int{}, diskQueued: map[int]int{}}
		for id, d := range gt.disks {
			r.diskStats[id] = d.cur
			r.diskOutstanding[id] = d.queued + d.inflight
			r.diskQueued[id] = d.queued
			if d.cur.ios > 0 || d.queued+d.inflight > 0 {
				r.activeShares += float64(max(d.policy.Shares, 1))
			}
			d.lat.add(&d.cur)
			d.cur = diskPeriod{}
		}
		window := gt.window
		gt.mu.Unlock()
		if per.ios > 0 {
			r.hostLatNs = per.normLatNs / float64(per.ios)
		}
		r.hostIOPS = float64(per.ios) / elapsed.Seconds()
		slots, err := gt.readSlots()
		statsErr := err
		if err != nil {
			g.logAt(slog.LevelWarn, "datastore %s: stats volume: %v", gt.name, err)
		}
		var recs []statsRecord
		for _, sl := range slots {
			if sl.ok {
				recs = append(recs, sl.rec)
			}
		}
		out := pardaStep(gt.parda, periodInput{Host: g.opts.Host, EndNs: now.UnixNano(), PeriodNs: elapsed.Nanoseconds(),
			IOs: per.ios, NormLatSumNs: per.normLatNs, ActiveShares: r.activeShares, Window: window, Peak: per.peak, Recs: recs})
		if err == nil {
			gt.slot, gt.scan = chooseSlot(g.opts.Host, gt.slot, slots, now.UnixNano())
			if err := gt.writeStats(out.Publish); err != nil {
				g.logAt(slog.LevelWarn, "datastore %s: stats volume: %v", gt.name, err)
				statsErr = err
			}
		}
		gt.mu.Lock()
		gt.statsErr = statsErr
		gt.mu.Unlock()
		r.dsLatNs, r.hosts = out.View.LatNs, out.View.Hosts
		if gt.parda != nil {
			gt.mu.Lock()
			gt.window = out.Window
			gt.slots.Note(now.UnixNano(), gt.outstanding, gt.window)
			gt.capacity = gt.capacity.Observe(out.View, gt.parda.Config().ThresholdNs, now.UnixNano())
			gt.mu.Unlock()
			gt.kick()
		}
		res[i] = r
	}
	return g.buildStatus(now, elapsed, res)
}

// readSlots reads the datastore's identity and the first gt.scan slots of
// the stats volume. Stats I/O goes straight to the datastore: it is
// control traffic (one read of (1+scan)×4 KiB and one 4 KiB write per
// period), outside the window and the disks' schedules. A datastore whose
// identity changed fails the gate.
func (gt *datastoreGate) readSlots() ([]slotRead, error) {
	n := min(gt.scan, statsSlots, int((gt.stats.sizeBytes()-statsHeaderBytes)/StatsSlotBytes))
	buf := alignedBuf(statsHeaderBytes + n*StatsSlotBytes)
	if err := gt.stats.readAt(buf, 0); err != nil {
		return nil, err
	}
	if err := sameDatastore(gt.id, buf[:statsHeaderBytes]); err != nil {
		gt.fail(err)
		return nil, err
	}
	out := make([]slotRead, n)
	for k := range out {
		off := statsHeaderBytes + k*StatsSlotBytes
		out[k].rec, out[k].ok = decodeStatsRecord(buf[off : off+StatsSlotBytes])
	}
	return out, nil
}

// writeStats writes rec to this host's slot of the stats volume.
func (gt *datastoreGate) writeStats(rec statsRecord) error {
	b := alignedBuf(StatsSlotBytes)
	copy(b, encodeStatsRecord(rec))
	return gt.stats.writeAt(b, uint64(statsHeaderBytes+gt.slot*StatsSlotBytes), false)
}

func (g *Gateway) snapshot(now time.Time, res []periodResult) Status {
	return g.buildStatus(now, 0, res)
}

func (g *Gateway) buildStatus(now time.Time, elapsed time.Duration, res []periodResult) Status {
	g.mu.Lock()
	listen := g.listen
	g.mu.Unlock()
	st := Status{Host: g.opts.Host, TimeUnixNs: now.UnixNano(), PeriodS: elapsed.Seconds(), Listen: listen}
	for i, gt := range g.gates {
		var r periodResult
		if i < len(res) {
			r = res[i]
		}
		gt.mu.Lock()
		ds := DatastoreStatus{Name: gt.name, Window: gt.window, DatastoreLatencyMs: r.dsLatNs / 1e6,
			HostLatencyMs: r.hostLatNs / 1e6, HostIOPS: r.hostIOPS, ActiveShares: r.activeShares,
			HostsSeen: r.hosts, Outstanding: gt.outstanding, SIOC: gt.parda != nil}
		if gt.parda != nil {
			ds.ThresholdMs = gt.parda.Config().ThresholdNs / 1e6
		}
		ds.CapacityPeriods = gt.capacity.Periods()
		if v, ok := gt.capacity.Estimate(); ok {
			ds.MeasuredIOPS = v
		}
		if gt.failed != nil {
			ds.Error = gt.failed.Error()
		}
		first := len(st.Disks)
		var wants []bool // of the disks from first: a request waited at the period's end
		for id, d := range gt.disks {
			s := DiskStatus{Disk: d.v.Export(), Datastore: gt.name, Volume: d.v.Name(), Shares: d.policy.Shares,
				ReservationIOPS: int64(d.policy.ReservationIOPS), Outstanding: d.queued + d.inflight,
				ReadsTotal: d.reads, WritesTotal: d.writes, Latency: d.lat}
			if d.policy.LimitIOPS != policy.UnlimitedIOPS {
				s.LimitIOPS = int64(d.policy.LimitIOPS)
			}
			if d.lost != nil {
				s.Error = d.lost.Error()
			}
			if p, ok := r.diskStats[id]; ok && elapsed > 0 {
				s.IOPS = float64(p.ios) / elapsed.Seconds()
				s.MBps = float64(p.bytes) / 1e6 / elapsed.Seconds()
				if p.ios > 0 {
					s.LatencyMeanMs = p.latSumNs / float64(p.ios) / 1e6
				}
				s.LatencyP99Ms = p.hist.quantileNs(0.99) / 1e6
				s.Outstanding = r.diskOutstanding[id]
			}
			st.Disks = append(st.Disks, s)
			wants = append(wants, r.diskQueued[id] > 0)
		}
		gt.mu.Unlock()
		if elapsed > 0 {
			entitleDisks(st.Disks[first:], wants)
		}
		st.Datastores = append(st.Datastores, ds)
	}
	sort.Slice(st.Disks, func(a, b int) bool { return st.Disks[a].Disk < st.Disks[b].Disk })
	return st
}

// writeStatusFile replaces path atomically with st as JSON.
func writeStatusFile(path string, st Status) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadStatusFile reads a status file written by a gateway.
func ReadStatusFile(path string) (Status, error) {
	var st Status
	err := inputfile.ReadJSON(path, inputfile.MaxStateBytes, &st) // PATH[:LINE]: message
	return st, err
}
