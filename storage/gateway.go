package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

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
	// Datastores maps a datastore name to its NBD URI (nbd://IP:PORT[/export]
	// or nbd+unix:///export?socket=PATH). Every datastore holding a disk of
	// this host must be given.
	Datastores map[string]string
	// Period is the control period (default: the datastore's SIOC control
	// period, else 4 s).
	Period time.Duration
	// StatusFile receives the Status as JSON after every period ("" : none).
	StatusFile string
	// OnPeriod, if set, is called with the Status after every period.
	OnPeriod func(Status)
	// Logf receives one line per notable event (nil: silent).
	Logf func(format string, args ...any)
	// Clock is the source of time for the control period, the schedulers'
	// tags and latency measurement (nil: real time).
	Clock Clock
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
	clk     Clock
	gates   []*datastoreGate
	exports nbd.MapExports
	srv     *nbd.Server

	mu     sync.Mutex
	status Status
	listen string
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	closeOnce sync.Once
	closeErr  error
}

// New connects to the datastores and prepares the exports; it serves
// nothing until Serve.
func New(opts Options) (*Gateway, error) {
	p := opts.Policy
	if p == nil {
		return nil, errors.New("gateway: no policy")
	}
	found := false
	for _, h := range p.Hosts {
		found = found || h.Name == opts.Host
	}
	if !found {
		return nil, fmt.Errorf("gateway: host %q is not in the policy", opts.Host)
	}
	g := &Gateway{opts: opts, clk: opts.Clock, exports: nbd.MapExports{}, stop: make(chan struct{})}
	if g.clk == nil {
		g.clk = realClock{}
	}
	if g.opts.Logf == nil {
		g.opts.Logf = func(string, ...any) {}
	}
	for _, ds := range p.Datastores {
		extents, required := Layout(p, ds.Name)
		var mine []Extent
		var pds []policy.Disk
		for _, e := range extents {
			for _, vm := range p.VMs {
				if vm.Name != e.VM || vm.Host != opts.Host {
					continue
				}
				for _, d := range vm.Disks {
					if d.Name == e.Disk {
						mine = append(mine, e)
						pds = append(pds, d)
					}
				}
			}
		}
		uri, ok := opts.Datastores[ds.Name]
		if !ok {
			if len(mine) > 0 {
				g.closeGates()
				return nil, fmt.Errorf("gateway: datastore %s: no --datastore %s=nbd://IP:PORT given", ds.Name, ds.Name)
			}
			continue
		}
		gate, err := newGate(g.clk, ds, uri, required, opts.Host, p, opts.PollNs)
		if err != nil {
			g.closeGates()
			return nil, err
		}
		for i, e := range mine {
			d := &disk{gate: gate, idx: i, ext: e, policy: pds[i]}
			gate.disks = append(gate.disks, d)
			if err := gate.sched.AddClient(i, mclockParams(pds[i])); err != nil {
				g.closeGates()
				return nil, fmt.Errorf("gateway: disk %s: %w", e.Name(), err)
			}
			g.exports[e.Name()] = d
		}
		g.gates = append(g.gates, gate)
	}
	for name := range opts.Datastores {
		if _, ok := dsByName(p, name); !ok {
			g.closeGates()
			return nil, fmt.Errorf("gateway: --datastore %s: no such datastore in the policy", name)
		}
	}
	g.srv = &nbd.Server{Exports: g.exports, Logf: g.opts.Logf, PollNs: opts.PollNs, MaxConns: opts.MaxConns}
	g.status = g.snapshot(g.clk.Now(), nil)
	return g, nil
}

func dsByName(p *policy.Policy, name string) (policy.Datastore, bool) {
	for _, d := range p.Datastores {
		if d.Name == name {
			return d, true
		}
	}
	return policy.Datastore{}, false
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

func newGate(clk Clock, ds policy.Datastore, uri string, required uint64, host string, p *policy.Policy, pollNs int64) (*datastoreGate, error) {
	up, err := newUpstream(clk, uri, pollNs)
	if err != nil {
		return nil, fmt.Errorf("gateway: datastore %s: %w", ds.Name, err)
	}
	size, err := up.sizeBytes()
	if err != nil {
		return nil, fmt.Errorf("gateway: datastore %s: %w", ds.Name, err)
	}
	if size < required {
		up.close()
		return nil, fmt.Errorf("gateway: datastore %s: export has %d bytes, the layout needs %d (disks + %d-byte stats region)", ds.Name, size, required, StatsRegionBytes)
	}
	off, err := statsSlot(p, host, size)
	if err != nil {
		up.close()
		return nil, fmt.Errorf("gateway: datastore %s: %w", ds.Name, err)
	}
	g := &datastoreGate{clk: clk, name: ds.Name, ds: ds, up: up, exportBytes: size, statsOff: off, window: uncontrolledWindow,
		sched: mclock.New(mclock.Config{LimitBurstNs: limitBurstNs}), ops: map[uint64]*op{}}
	if ds.SIOC.Enabled {
		g.parda = pardaController(ds.SIOC)
		g.window = initialWindow(g.parda)
	}
	return g, nil
}

func (g *Gateway) closeGates() {
	for _, gt := range g.gates {
		gt.up.close()
	}
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
		close(g.stop)
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
			g.opts.Logf("gateway: requests still at the datastore %v after close; aborting them", closeGrace)
			for _, gt := range g.gates {
				gt.up.abort()
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

// Status returns the measurements of the last complete period.
func (g *Gateway) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.status
	st.Listen = g.listen // the listeners serving now
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
					g.opts.Logf("gateway: status file: %v", err)
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
	diskStats                                  []diskPeriod
	diskOutstanding                            []int
}

// closePeriod ends the period on every datastore: it takes the period's
// counters, reads the other hosts' records from the stats region, lets
// pardaStep decide the new window, publishes this host's record and
// applies the window.
func (g *Gateway) closePeriod(now time.Time, elapsed time.Duration) Status {
	res := make([]periodResult, len(g.gates))
	for i, gt := range g.gates {
		gt.mu.Lock()
		per := gt.period
		gt.period = dsPeriod{}
		r := periodResult{}
		for _, d := range gt.disks {
			r.diskStats = append(r.diskStats, d.cur)
			r.diskOutstanding = append(r.diskOutstanding, d.queued+d.inflight)
			if d.cur.ios > 0 || d.queued+d.inflight > 0 {
				r.activeShares += float64(max(d.policy.Shares, 1))
			}
			d.cur = diskPeriod{}
		}
		window := gt.window
		gt.mu.Unlock()
		if per.ios > 0 {
			r.hostLatNs = per.normLatNs / float64(per.ios)
		}
		r.hostIOPS = float64(per.ios) / elapsed.Seconds()
		recs, err := gt.readStats(len(g.opts.Policy.Hosts))
		if err != nil {
			g.opts.Logf("gateway: datastore %s: stats region: %v", gt.name, err)
		}
		out := pardaStep(gt.parda, periodInput{Host: g.opts.Host, EndNs: now.UnixNano(), PeriodNs: elapsed.Nanoseconds(),
			IOs: per.ios, NormLatSumNs: per.normLatNs, ActiveShares: r.activeShares, Window: window, Recs: recs})
		if err := gt.writeStats(out.Publish); err != nil {
			g.opts.Logf("gateway: datastore %s: stats region: %v", gt.name, err)
		}
		r.dsLatNs, r.hosts = out.View.latNs, out.View.hosts
		if gt.parda != nil {
			gt.mu.Lock()
			gt.window = out.Window
			gt.mu.Unlock()
			gt.kick()
		}
		res[i] = r
	}
	return g.buildStatus(now, elapsed, res)
}

// readStats reads the records of all hosts' slots (those that decode).
// Stats I/O goes straight to the datastore: it is control traffic (one
// hosts×4 KiB read and one 4 KiB write per period), outside the window and
// the disks' schedules.
func (gt *datastoreGate) readStats(hosts int) ([]statsRecord, error) {
	region := make([]byte, hosts*StatsSlotBytes)
	err := gt.up.do(func(c *nbd.Client) error {
		return c.ReadAt(region, gt.exportBytes-StatsRegionBytes)
	})
	if err != nil {
		return nil, err
	}
	var out []statsRecord
	for off := 0; off+StatsSlotBytes <= len(region); off += StatsSlotBytes {
		if r, ok := decodeStatsRecord(region[off : off+StatsSlotBytes]); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// writeStats writes rec to this host's slot of the stats region.
func (gt *datastoreGate) writeStats(rec statsRecord) error {
	return gt.up.do(func(c *nbd.Client) error {
		return c.WriteAt(rec.encode(), gt.statsOff, false)
	})
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
		for j, d := range gt.disks {
			s := DiskStatus{Disk: d.ext.Name(), Datastore: gt.name, Shares: d.policy.Shares,
				ReservationIOPS: int64(d.policy.ReservationIOPS), Outstanding: d.queued + d.inflight}
			if d.policy.LimitIOPS != policy.UnlimitedIOPS {
				s.LimitIOPS = int64(d.policy.LimitIOPS)
			}
			if j < len(r.diskStats) && elapsed > 0 {
				p := r.diskStats[j]
				s.IOPS = float64(p.ios) / elapsed.Seconds()
				s.MBps = float64(p.bytes) / 1e6 / elapsed.Seconds()
				if p.ios > 0 {
					s.LatencyMeanMs = p.latSumNs / float64(p.ios) / 1e6
				}
				s.LatencyP99Ms = p.hist.quantileNs(0.99) / 1e6
				s.Outstanding = r.diskOutstanding[j]
			}
			st.Disks = append(st.Disks, s)
		}
		gt.mu.Unlock()
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
