package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sluice/agent"
	"sluice/controller"
	"sluice/internal/ops"
	"sluice/policy"
	"sluice/policyfile"
	"sluice/storage"
	"sluice/storage/nbd"
)

// gatewayStatusFile is the gateway's status file of host in dir (its
// default --status-file in statusDir).
func gatewayStatusFile(dir, cluster, host string) string {
	return filepath.Join(dir, "gateway-"+cluster+"-"+host+".json")
}

// gatewayMeasured returns the capacities of the datastores that host's
// gateway measured (its status file in dir, DatastoreStatus.MeasuredIOPS,
// whole IOPS), when the file was written within maxAge of now; nothing
// otherwise (no gateway, another --status-file, a gateway stopped).
func gatewayMeasured(dir, cluster, host string, now time.Time, maxAge time.Duration) map[string]float64 {
	st, err := storage.ReadStatusFile(gatewayStatusFile(dir, cluster, host))
	if err != nil || now.Sub(time.Unix(0, st.TimeUnixNs)) > maxAge {
		return nil
	}
	out := map[string]float64{}
	for _, d := range st.Datastores {
		if d.MeasuredIOPS >= 1 {
			out[d.Name] = math.Floor(d.MeasuredIOPS)
		}
	}
	return out
}

// lastMeasured returns the datastores' capacities that host's gateway
// (its status file in gatewayDir) and throttle driver (the agent's status
// file in stateDir) measured last, however long ago: the hook's fallback
// when the agent does not answer counts them, as the agent would. A
// capacity is the datastore's, not the agent's, and /run is emptied when
// the host boots. The throttle driver's wins where both measured one, as
// in the agent.
func lastMeasured(gatewayDir, stateDir, cluster, host string) map[string]float64 {
	m := gatewayMeasured(gatewayDir, cluster, host, time.Now(), time.Duration(math.MaxInt64))
	ts, err := agent.ReadThrottleStatus(agent.ThrottleStatusPath(stateDir, cluster, host))
	if err != nil {
		return m
	}
	for _, d := range ts.Datastores {
		if d.MeasuredIOPS >= 1 {
			if m == nil {
				m = map[string]float64{}
			}
			m[d.Name] = math.Floor(d.MeasuredIOPS)
		}
	}
	return m
}

// statusDir is where gateways publish their status (one JSON file per host).
const statusDir = "/run/sluice"

func init() {
	register(command{
		name:    "gateway",
		summary: "storage gateway of a host: NBD exports per VM disk with mClock and PARDA ('gateway status' shows stats)",
		run:     runGateway,
	})
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

const gatewayUsage = "usage: sluice gateway --host H --policy FILE|--controller URL --token-file F --datastore DS=nbd://IP:PORT|dir:PATH [--reload 2s] [--socket-dir DIR|none] [--socket-owner USER[:GROUP]] [--socket-mode 0600] [--listen unix:PATH|ADDR:PORT --tls-cert F --tls-key F --tls-ca F] [--max-conns N] [--max-conns-per-vm N] [--period 4s] [--metrics-listen 127.0.0.1:9642|\"\"] [--log-format text|json]"

func runGateway(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runGatewayStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "disk-xml" {
		return runGatewayDiskXML(args[1:], stdout, stderr)
	}
	fs := newFlagSet("gateway")
	host := fs.String("host", "", "policy host this gateway serves (required)")
	pol := fs.String("policy", "", "policy file (required)")
	// Where VMs connect (docs/storage.md, "Access control" and "TLS").
	socketDir := fs.String("socket-dir", "", "directory of the per-VM sockets DIR/VM.sock (default "+statusDir+"/gw-CLUSTER-HOST; none: no per-VM sockets)")
	socketOwner := fs.String("socket-owner", "", "USER[:GROUP] owning the per-VM sockets (default: the gateway's user)")
	socketMode := fs.String("socket-mode", "0600", "mode of the per-VM sockets (octal)")
	var listens multiFlag
	fs.Var(&listens, "listen", "more listeners (repeatable): unix:PATH (every disk; the administrator's socket, mode 0600) or ADDR:PORT (TCP, needs --tls-*)")
	tlsCert := fs.String("tls-cert", "", "TLS certificate of the gateway (PEM), for --listen ADDR:PORT")
	tlsKey := fs.String("tls-key", "", "its private key (PEM)")
	tlsCA := fs.String("tls-ca", "", "CA certificate(s) (PEM) that sign the clients' certificates (Common Name = VM name)")
	maxConns := fs.Int("max-conns", nbd.DefaultMaxConns, "connections open at once over all listeners")
	maxConnsVM := fs.Int("max-conns-per-vm", storage.DefaultMaxConnsPerVM, "connections open at once on one VM's socket, and with one VM's certificate on the TLS listener")
	period := fs.Duration("period", 0, "control period (default: the datastore's sioc.controlPeriod)")
	statusFile := fs.String("status-file", "", "status JSON file (default "+statusDir+"/gateway-CLUSTER-HOST.json; removed on exit)")
	// One OS thread runs the gateway by default: the request path is a few
	// socket calls, and with more threads Go's idle path wakes a second
	// thread per request, which on a small VM costs more latency and IOPS
	// than it gains (docs/perf/storage.md).
	cpus := fs.Int("cpus", 1, "OS threads running Go code (GOMAXPROCS); 0 keeps Go's default")
	// Bounded busy polling (Options.PollNs): CPU for latency.
	poll := fs.Duration("poll", 0, "poll sockets for up to this long for an expected answer before sleeping (CPU for latency; 0 = off)")
	reload := fs.Duration("reload", 2*time.Second, "how often to look for a changed policy file (VMs that arrived or left; 0: only on SIGHUP)")
	var ctl controllerFlags
	ctl.register(fs)
	var dss multiFlag
	fs.Var(&dss, "datastore", "DS=nbd://IP:PORT, DS=nbd+unix:///?socket=PATH or DS=dir:PATH (repeatable)")
	var opsf opsFlags
	opsf.register(fs, ops.DefaultGatewayMetrics)
	config := addConfigFlag(fs, "gateway")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	if err := config.apply(fs, nil); err != nil {
		fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
		return exitUsage
	}
	if *poll < 0 {
		fmt.Fprintln(stderr, "sluice gateway: --poll must be ≥ 0")
		return exitUsage
	}
	if err := opsf.check(); err != nil {
		fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
		return exitUsage
	}
	if *cpus < 0 {
		fmt.Fprintln(stderr, "sluice gateway: --cpus must be ≥ 0")
		return exitUsage
	}
	if *cpus > 0 {
		runtime.GOMAXPROCS(*cpus)
	}
	if *reload < 0 {
		fmt.Fprintln(stderr, "sluice gateway: --reload must be ≥ 0")
		return exitUsage
	}
	if *host == "" || (*pol == "") == (ctl.server == "") || fs.NArg() > 0 {
		fmt.Fprintln(stderr, gatewayUsage)
		return exitUsage
	}
	if *maxConns < 1 || *maxConnsVM < 1 {
		fmt.Fprintln(stderr, "sluice gateway: --max-conns and --max-conns-per-vm must be ≥ 1")
		return exitUsage
	}
	perm := storage.DefaultSocketPerm
	if m, err := strconv.ParseUint(*socketMode, 8, 32); err != nil || m > 0o777 {
		fmt.Fprintf(stderr, "sluice gateway: --socket-mode %q: want an octal mode such as 0600 or 0660\n", *socketMode)
		return exitUsage
	} else {
		perm.Mode = os.FileMode(m)
	}
	if *socketOwner != "" {
		uid, gid, err := storage.ParseSocketOwner(*socketOwner)
		if err != nil {
			fmt.Fprintf(stderr, "sluice gateway: --socket-owner %q: %v\n", *socketOwner, err)
			return exitUsage
		}
		perm.UID, perm.GID = uid, gid
	}
	var tcp []string
	for _, a := range listens {
		if !strings.HasPrefix(a, "unix:") {
			tcp = append(tcp, a)
		}
	}
	tlsSet := *tlsCert != "" || *tlsKey != "" || *tlsCA != ""
	if len(tcp) > 0 && (*tlsCert == "" || *tlsKey == "" || *tlsCA == "") {
		fmt.Fprintf(stderr, "sluice gateway: --listen %s: TCP is served only with TLS: give --tls-cert, --tls-key and --tls-ca\n", tcp[0])
		return exitUsage
	}
	if tlsSet && len(tcp) == 0 {
		fmt.Fprintln(stderr, "sluice gateway: --tls-cert/--tls-key/--tls-ca need a --listen ADDR:PORT")
		return exitUsage
	}
	uris := map[string]string{}
	for _, d := range dss {
		name, uri, ok := strings.Cut(d, "=")
		if !ok || name == "" || uri == "" {
			fmt.Fprintf(stderr, "sluice gateway: --datastore %q: want DS=nbd://IP:PORT or DS=dir:PATH\n", d)
			return exitUsage
		}
		uris[name] = uri
	}
	var p *policy.Policy
	var cl *controller.Client
	var desired controller.DesiredHost
	var stamp string
	if ctl.server != "" {
		var err error
		if cl, err = ctl.client(); err != nil {
			fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
			return exitBad
		}
		// The controller sends the host its part of the policy: the VMs
		// placed here, with their disks, and the datastores.
		ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		desired, err = ctl.startState(ctx, cl, *host, func(format string, args ...any) {
			fmt.Fprintf(stderr, "sluice gateway: "+format+"\n", args...)
		})
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
			return exitBad
		}
		p = desired.Policy
	} else {
		var code int
		stamp = policyfile.Stamp(*pol) // before loading: a change in between is applied
		if p, code = loadPolicy(*pol, stderr); p == nil {
			return code
		}
	}
	if *statusFile == "" {
		*statusFile = gatewayStatusFile(statusDir, p.Cluster, *host)
	}
	var tlsCfg *tls.Config
	if len(tcp) > 0 {
		var err error
		if tlsCfg, err = storage.ServerTLSConfig(*tlsCert, *tlsKey, *tlsCA); err != nil {
			fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
			return exitBad
		}
	}
	if *socketDir == "" {
		*socketDir = storage.SocketDir(p.Cluster, *host)
	}
	log := opsf.logger(stderr, "gateway")
	g, err := storage.New(storage.Options{Host: *host, Policy: p, Datastores: uris, Period: *period,
		StatusFile: *statusFile, PollNs: poll.Nanoseconds(), MaxConns: *maxConns, MaxConnsPerVM: *maxConnsVM,
		Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	// Every listener is opened before any is served: an error leaves none.
	var serves []func() error
	var where []string
	var opened []net.Listener
	fail := func(err error) int {
		for _, l := range opened {
			l.Close()
		}
		g.Close()
		fmt.Fprintf(stderr, "sluice gateway: %v\n", err)
		return exitBad
	}
	// The VMs' sockets follow the VMs the gateway serves (they come and
	// go with the policy or the controller's placement).
	var vs *storage.VMSockets
	if *socketDir != "none" {
		vs = storage.NewVMSockets(g, *socketDir, perm)
		if err := vs.Sync(); err != nil {
			return fail(err)
		}
		where = append(where, fmt.Sprintf("%s (one socket per VM, mode %#o)", storage.VMSocket(*socketDir, "VM"), perm.Mode))
	}
	defer vs.Close()
	for _, a := range listens {
		l, err := storage.Listen(a)
		if err != nil {
			return fail(err)
		}
		opened = append(opened, l)
		if strings.HasPrefix(a, "unix:") {
			serves = append(serves, func() error { return g.Serve(l) })
			where = append(where, a+" (every disk)")
		} else {
			serves = append(serves, func() error { return g.ServeTLS(l, tlsCfg) })
			where = append(where, l.Addr().String()+" (TLS)")
		}
	}
	// A host without VMs yet waits for them on its VMs' sockets (they
	// arrive with the policy or the controller's placement).
	if len(serves) == 0 && *socketDir == "none" {
		return fail(errors.New("nothing to serve on: --socket-dir none and no --listen given"))
	}
	// The gateway follows the controller's desired state of the host, or
	// its policy file, until it stops (before its VMs' sockets close).
	follow, stopFollowing := context.WithCancel(context.Background())
	following := make(chan struct{})
	defer func() { stopFollowing(); <-following }()
	// SIGINT/SIGTERM stop the gateway from the moment it says it serves.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	stopped := make(chan struct{})
	defer close(stopped)
	closed := make(chan struct{})
	go func() {
		select {
		case <-sig:
			close(closed)
			stopFollowing()
			g.Close()
		case <-stopped:
		}
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	logAt := func(level slog.Level, msg string) { log.Log(context.Background(), level, msg) }
	go func() {
		defer close(following)
		if cl != nil {
			w := &controller.Watch{Client: cl, Host: *host, From: desired.Revision, Log: logAt,
				Apply: func(d controller.DesiredHost) error { return applyDesired(g, vs, d, log) }}
			w.Run(follow)
			return
		}
		w := &policyfile.Watch{Path: *pol, From: stamp, Every: *reload, Reload: hup, Log: logAt,
			Apply: func(p *policy.Policy) error { return applyPolicy(g, vs, p, log) }}
		w.Run(follow)
	}()
	log.Info(fmt.Sprintf("host %s serving %s on %s", *host, strings.Join(g.Exports(), " "), strings.Join(where, ", ")))
	// Ready while every datastore answers (storage.Gateway.Ready).
	defer opsf.serve(log, g.Ready, storage.NewMetrics(g)).Close()
	errs := make(chan error, len(serves))
	for _, serve := range serves {
		go func() { errs <- serve() }()
	}
	for n := len(serves); ; n-- {
		if n == 0 {
			<-closed // only VM sockets: they serve until the gateway stops
			break
		}
		if e := <-errs; e != nil && err == nil {
			err = e
			g.Close() // one listener failed: stop the others
		}
	}
	g.Close()
	_ = os.Remove(*statusFile) // a stopped gateway has no status
	if err != nil {
		log.Error(err.Error())
		return exitBad
	}
	return exitOK
}

// applyDesired has g serve the host's part of the policy in the
// controller's desired state d and vs follow its VMs: VMs that migrate in
// get their disks served, VMs that left have theirs drained and closed.
// The gateway does not register the host (the agent does).
func applyDesired(g *storage.Gateway, vs *storage.VMSockets, d controller.DesiredHost, log *slog.Logger) error {
	if err := g.SetPolicy(d.Policy); err != nil {
		return err
	}
	if err := vs.Sync(); err != nil {
		return err
	}
	log.Info(fmt.Sprintf("desired state %d; serving %s", d.Revision, strings.Join(g.Exports(), " ")))
	return nil
}

// applyPolicy has g serve p, a policy file reloaded, and vs follow its
// VMs: VMs that arrived on the host get their disks served, VMs that left
// have theirs drained and closed.
func applyPolicy(g *storage.Gateway, vs *storage.VMSockets, p *policy.Policy, log *slog.Logger) error {
	if err := errors.Join(g.SetPolicy(p), vs.Sync()); err != nil {
		return err
	}
	log.Info(fmt.Sprintf("policy reloaded; serving %s", strings.Join(g.Exports(), " ")))
	return nil
}

func runGatewayStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gateway status")
	host := fs.String("host", "", "only this host")
	out := fs.String("o", "table", "output: table or json")
	dir := fs.String("dir", statusDir, "directory of the gateways' status files")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || (*out != "table" && *out != "json") {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		fmt.Fprintln(stderr, "usage: sluice gateway status [--host H] [-o table|json] [--dir DIR]")
		return exitUsage
	}
	files, _ := filepath.Glob(filepath.Join(*dir, "gateway-*.json"))
	sort.Strings(files)
	var sts []storage.Status
	for _, f := range files {
		st, err := storage.ReadStatusFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "sluice gateway status: %v\n", err)
			return exitBad
		}
		if *host == "" || st.Host == *host {
			sts = append(sts, st)
		}
	}
	if len(sts) == 0 {
		fmt.Fprintf(stderr, "sluice gateway status: no gateway status in %s\n", *dir)
		return exitBad
	}
	if *out == "json" {
		b, _ := json.MarshalIndent(sts, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	for _, st := range sts {
		age := time.Since(time.Unix(0, st.TimeUnixNs)).Round(time.Second)
		fmt.Fprintf(stdout, "host %s  listen %s  period %.1fs  (%s ago)\n", st.Host, st.Listen, st.PeriodS, age)
		for _, d := range st.Datastores {
			measured := measuredText(d.MeasuredIOPS, d.CapacityPeriods)
			fmt.Fprintf(stdout, "  datastore %-10s window %6.1f  outstanding %3d  datastore latency %7.2f ms (threshold %.0f ms, %d hosts)  host %7.0f IOPS %7.2f ms  measured %s\n",
				d.Name, d.Window, d.Outstanding, d.DatastoreLatencyMs, d.ThresholdMs, d.HostsSeen, d.HostIOPS, d.HostLatencyMs, measured)
		}
		fmt.Fprintf(stdout, "  %-20s %-10s %6s %6s %6s %8s %8s %9s %9s %5s\n", "DISK", "DATASTORE", "SHARES", "RES", "LIMIT", "IOPS", "MB/s", "LAT ms", "P99 ms", "OUT")
		for _, d := range st.Disks {
			lim := "-"
			if d.LimitIOPS > 0 {
				lim = fmt.Sprint(d.LimitIOPS)
			}
			fmt.Fprintf(stdout, "  %-20s %-10s %6d %6d %6s %8.0f %8.2f %9.2f %9.2f %5d\n", d.Disk, d.Datastore, d.Shares, d.ReservationIOPS, lim, d.IOPS, d.MBps, d.LatencyMeanMs, d.LatencyP99Ms, d.Outstanding)
		}
	}
	return exitOK
}
