package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"sluice/admit"
	"sluice/agent"
	"sluice/controller"
	"sluice/cpuctl"
	"sluice/hostside"
	"sluice/internal/ops"
	"sluice/lab"
	"sluice/nicinfo"
	"sluice/policy"
	"sluice/policyfile"
	"sluice/storage"
	"sluice/throttle/dirstats"
	"sluice/virt"
)

func init() {
	register(command{name: "agent", summary: "host agent: HTB per uplink, dynamic enforcement, stats (agent status)", run: runAgent})
	// Every flag, from the flag set the agent parses: the help cannot
	// leave one out.
	var b strings.Builder
	agentUsage(&b)
	b.WriteString(agentAbout)
	fs, _ := newAgentFlags()
	b.WriteString("\nflags:\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	b.WriteString(agentExample)
	helps["agent"] = b.String()
}

const agentAbout = `
The host agent: an HTB tree per uplink from the policy, dynamic
enforcement every interval, statistics in the state directory. It follows
the inventory's VMs (libvirt's domains as they start and stop) and its
policy file (re-read on change or SIGHUP), or the controller (--controller:
its policy, the host's desired state, the moves to carry out; it reports
what runs here), without a restart; a move it cannot make is reported,
never a reason to stop. It answers the libvirt hook's admission questions
on STATE-DIR/agent-HOST.sock (sluice hook --help). It reads each uplink's
NIC (driver, speed, queues, offloads; ethtool netlink) at start and after
each change of the inventory or policy, shows it in agent status and the
metrics, and logs once when TSO, GSO or GRO is off, the link is slower
than the policy's speed, or it replaced an mq root (docs/agent.md, "The
uplink's NIC").
`

const agentExample = `
example:
  sluice agent --host h1 --policy examples/lab-1g.yaml
  sluice agent --inventory libvirt --uplink vmnic0=bond0 --host pve1 --policy /etc/sluice/policy.yaml
  sluice agent --inventory libvirt --uplink vmnic0=bond0 --host pve1 --cpu \
      --controller https://10.0.0.5:7443 --token-file /etc/sluice/token --ca /etc/sluice/ca.pem`

// agentOpts are the flags of sluice agent.
type agentOpts struct {
	host, file, nsName, stateDir *string
	interval                     *time.Duration
	dynamic, once, cpu           *bool
	datastores, probes           multiFlag
	storagePeriod                *time.Duration
	src                          inventoryFlags
	ctlf                         controllerFlags
	ops                          opsFlags
	config                       *configFlag
}

// newAgentFlags is sluice agent's flag set (runAgent parses it; the help
// lists it).
func newAgentFlags() (*flag.FlagSet, *agentOpts) {
	fs := newFlagSet("agent")
	o := &agentOpts{}
	o.config = addConfigFlag(fs, "agent")
	o.host = fs.String("host", "", "host name of the policy")
	o.file = fs.String("policy", "", "policy file (or --controller)")
	o.interval = fs.Duration("interval", 100*time.Millisecond, "control interval")
	o.dynamic = fs.Bool("dynamic", true, "dynamic enforcement (false: static HTB)")
	o.once = fs.Bool("once", false, "apply the tree once and exit")
	o.nsName = fs.String("netns", "", "network namespace of the host (default: sl-<cluster>-<host> when it exists, else the current one)")
	o.stateDir = fs.String("state-dir", lab.DefaultStateDir, "directory of the statistics file and the admission socket")
	o.cpu = fs.Bool("cpu", false, "also enforce the VMs' CPU reservations, shares and limits on their cgroups (docs/cpu.md)")
	fs.Var(&o.datastores, "datastore", "DS=DIR: datastore DS is mounted at DIR on this host; with the throttle driver the agent sets its disks' QEMU throttles (repeatable; docs/throttle.md)")
	o.storagePeriod = fs.Duration("storage-period", time.Second, "control period of the throttle driver")
	fs.Var(&o.probes, "datastore-probe", "DS=dir|none|nbd+unix:///EXPORT?socket=PATH: how the throttle driver measures DS's latency below QEMU's throttles (default dir: O_DIRECT reads of DIR/"+dirstats.ProbeName+"; repeatable)")
	o.src.register(fs)
	o.ctlf.register(fs)
	o.ops.register(fs, ops.DefaultAgentMetrics)
	return fs, o
}

func agentUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice agent --host NAME --policy FILE [--inventory lab|libvirt] [--uplink NAME=DEV ...] [--libvirt-socket PATH]")
	fmt.Fprintln(w, "       sluice agent --host NAME --controller https://HOST:PORT --token-file F [--ca F] [--lab-state-dir DIR] [...]")
	fmt.Fprintln(w, "                    [--migrate-uri URI --migrate-peer HOST=URI ... [--migrate-data URI]]   (libvirt: live migrations to this host)")
	fmt.Fprintln(w, "                    [--interval 100ms] [--dynamic=true|false] [--cpu] [--once] [--netns NS]")
	fmt.Fprintln(w, "                    [--datastore DS=DIR ... [--datastore-probe DS=dir|none|nbd+unix:///EXPORT?socket=PATH] [--storage-period 1s]]")
	fmt.Fprintln(w, "                    (the throttle driver: QEMU's throttle per disk, through libvirt; docs/throttle.md)")
	fmt.Fprintln(w, "                    [--metrics-listen 127.0.0.1:9641|\"\"] [--log-format text|json] [--state-dir /run/sluice]")
	fmt.Fprintln(w, "                    [--config /etc/sluice/agent.yaml]   (any of these flags as YAML, key: value; the command line wins)")
	fmt.Fprintln(w, "       sluice agent status --host NAME [--policy FILE] [-o table|json]")
	fmt.Fprintln(w, "       sluice agent uninstall --host NAME --policy FILE [--inventory lab|libvirt] [--uplink NAME=DEV ...] [--netns NS] [--lab-state-dir DIR]")
	fmt.Fprintln(w, "                    [--state-dir /run/sluice] [--kernel-default] [--config /etc/sluice/agent.yaml]   (the agent's config: its host, policy,")
	fmt.Fprintln(w, "                    uplinks and state directory; the root qdisc an uplink had comes from the agent's")
	fmt.Fprintln(w, "                    state file, else from "+agent.DefaultRootsDir+"; --kernel-default: where recorded nowhere, the kernel's default)")
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runAgentStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "uninstall" {
		return runAgentUninstall(args[1:], stdout, stderr)
	}
	fs, o := newAgentFlags()
	host, file, interval, dynamic, once, nsName, stateDir, cpu := o.host, o.file, o.interval, o.dynamic, o.once, o.nsName, o.stateDir, o.cpu
	src, ctlf := &o.src, &o.ctlf
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	if err := o.config.apply(fs, nil); err != nil {
		fmt.Fprintf(stderr, "sluice agent: %v\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 || *host == "" || (*file == "") == (ctlf.server == "") || *interval <= 0 || *o.storagePeriod <= 0 || !src.valid() {
		agentUsage(stderr)
		return exitUsage
	}
	if err := o.ops.check(); err != nil {
		fmt.Fprintf(stderr, "sluice agent: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "sluice agent: "+format+"\n", args...) }
	var p *policy.Policy
	var cl *controller.Client
	var desired controller.DesiredHost
	var stamp string // of the policy file loaded
	if ctlf.server != "" {
		var err error
		if cl, err = ctlf.client(); err != nil {
			logf("%s", labOneLine(err))
			return exitBad
		}
		// The controller sends the host its part of the policy (the host,
		// the VMs placed on it, the cluster-wide definitions).
		if desired, err = ctlf.startState(ctx, cl, *host, logf); err != nil {
			logf("%s", labOneLine(err))
			return exitBad
		}
		p = desired.Policy
		*file = ctlf.server
	} else {
		var code int
		stamp = policyfile.Stamp(*file) // before loading: a change in between is loaded
		if p, code = loadPolicy(*file, stderr); p == nil {
			return code
		}
	}
	if p.Host(*host) == nil {
		fmt.Fprintf(stderr, "sluice agent: host %q is not in %s\n", *host, *file)
		return exitBad
	}
	pl, err := src.labPlan(p, *stateDir, cl != nil)
	if err != nil {
		logf("%s", labOneLine(err))
		return exitBad
	}
	ns := src.netns(*nsName, p.Cluster, *host)
	k, err := agent.NewNetlinkKernel(ns)
	if err != nil {
		logf("%s", labOneLine(err))
		return exitBad
	}
	defer k.Close()
	inv, closeInv, err := src.open(p, pl, *host, k.Master, func(err error) { logf("%s", labOneLine(err)) })
	if err != nil {
		logf("%s", labOneLine(err))
		return exitBad
	}
	defer closeInv()
	log := o.ops.logger(stderr, "agent")
	policies := make(chan *policy.Policy)
	var side *hostside.Side
	if cl != nil {
		warn := ops.Logf(log, slog.LevelWarn)
		side, inv, err = newAgentSide(src, &ctlf.mig, pl, *host, inv, policies, func(err error) { warn("%s", labOneLine(err)) })
		if err != nil {
			logf("%s", labOneLine(err))
			return exitBad
		}
		// A move this host cannot make is reported to the controller
		// (a failed decision), not a reason to stop enforcing.
		if err := side.Arrive(desired); err != nil {
			warn("%s", labOneLine(err))
		}
	}
	var cgroups cpuctl.Cgroups
	if *cpu {
		tree, err := cpuctl.Detect("")
		if err != nil {
			fmt.Fprintf(stderr, "sluice agent: --cpu: %s\n", labOneLine(err))
			return exitBad
		}
		cgroups = tree
	}
	// With the CPU on a libvirt host, latency-sensitive VMs get their
	// vCPUs pinned to cores of their own (docs/cpu.md), through a
	// connection of its own.
	var pinner agent.Pinner
	if *cpu && src.kind == "libvirt" {
		conn, err := virt.Dial(src.socket)
		if err != nil {
			fmt.Fprintf(stderr, "sluice agent: --cpu: pinning: %s\n", labOneLine(err))
			return exitBad
		}
		defer conn.Close()
		pinner = conn.Pinner()
	}
	// The uplinks' NICs (driver, speed, queues, offloads), read in the
	// agent's namespace; without them the agent still enforces.
	var nics agent.NICReader
	if r, err := nicinfo.Open(ns); err != nil {
		logf("uplink NICs not read: %s", labOneLine(err))
	} else {
		defer r.Close()
		nics = r
	}
	a, err := agent.New(agent.Config{Policy: p, Host: *host, Kernel: k, Inventory: inv, Dynamic: *dynamic,
		RecordPath: agent.RecordPath(*stateDir, p.Cluster, *host), RootsDir: agent.DefaultRootsDir, Policies: policies, Cgroups: cgroups,
		Pinner: pinner, PinsPath: agent.PinsOriginalsPath(*stateDir, p.Cluster, *host),
		NIC: nics, VF: k, VFOriginalsPath: agent.VFOriginalsPath(*stateDir, p.Cluster, *host)})
	if err != nil {
		fmt.Fprintf(stderr, "sluice agent: %s\n", labOneLine(err))
		return exitBad
	}
	if *once {
		ch, err := a.Step(agent.NowNs())
		var nicLog agent.NICLog
		for _, w := range nicLog.Fresh(a.Stats()) {
			logf("%s", w)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice agent: %s\n", labOneLine(err))
			return exitBad
		}
		_ = agent.WriteStats(*stateDir, a.Stats())
		fmt.Fprintf(stdout, "applied: %s\n", ch)
		return exitOK
	}
	// The libvirt hook asks this agent whether a domain may start: one
	// source of truth for admission (agent.Admitter).
	adm := &agent.Admitter{Host: *host, Running: func() ([]admit.Domain, error) { return runningDomains(libvirtRunDir) }}
	if src.kind == "lab" {
		adm.Running = func() ([]admit.Domain, error) {
			vms, err := inv.VMs()
			var out []admit.Domain
			for _, vm := range vms {
				out = append(out, admit.Domain{Name: vm})
			}
			return out, err
		}
	}
	adm.Set(p, desired.Starting)
	sock := agent.AdmitSocket(*stateDir, *host)
	go func() {
		if err := adm.ServeAdmit(ctx, sock); err != nil {
			log.Error(labOneLine(err) + " (the hook decides from its policy file, if it has one)")
		}
	}()
	lastErr := ""
	nsGone := false
	// The policy file is followed (its content polled, SIGHUP) and a good
	// new policy taken without a restart; with a controller SIGHUP does
	// nothing.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if side != nil {
		side.Attach(ctx, adm)
		adm.Ask = askController(cl, *host)
		fol := &controller.Follower{Client: cl, Host: *host, Agent: side, Log: log}
		go fol.Run(ctx)
	} else {
		// A new policy file goes to the admitter and to the agent.
		w := &policyfile.Watch{Path: *file, From: stamp, Every: time.Duration(policyPollNs), Reload: hup,
			Log: func(level slog.Level, msg string) { log.Log(context.Background(), level, msg) },
			Apply: func(np *policy.Policy) error {
				adm.Set(np, nil)
				select {
				case policies <- np:
				case <-ctx.Done():
					return ctx.Err()
				}
				log.Info(fmt.Sprintf("policy %s reloaded", *file))
				return nil
			}}
		go w.Run(ctx)
	}
	var th *agent.Throttler
	if len(o.datastores) > 0 {
		var closeTh func()
		th, closeTh, err = startThrottler(p, *host, o.datastores, o.probes, src.socket, *stateDir, labDomains(src.kind, p.Cluster), logf)
		if err != nil {
			logf("%s", labOneLine(err))
			return exitBad
		}
		if th != nil {
			defer closeTh()
			go th.Run(ctx, nil, *o.storagePeriod, func(_ agent.ThrottleStatus, err error) {
				if err != nil {
					log.Error("throttle driver: " + labOneLine(err))
				}
			})
		}
	}
	// The datastores' capacities this host measured, for admission: its
	// throttle driver's, and its gateway's (from its status file).
	measured := func() map[string]float64 {
		m := gatewayMeasured(statusDir, p.Cluster, *host, time.Now(), gatewayStatusMaxAge)
		if th != nil {
			if m == nil {
				m = map[string]float64{}
			}
			maps.Copy(m, th.Measured())
		}
		return m
	}
	if side != nil {
		side.SetCapacities(measured)
	}
	adm.SetMeasured(measured)
	thPolicy := p
	invErr := src.follow(ctx, inv, stop)
	log.Info(fmt.Sprintf("host %s (netns %q, inventory %s), %d uplinks, dynamic=%v, cpu=%v, interval %s", *host, ns, src.kind, len(a.Trees()), *dynamic, *cpu, *interval))
	// Metrics read the last step's statistics; ready once a step applied
	// the trees, until a step fails or none comes for 10 intervals (5 s
	// at least).
	met := agent.NewMetrics()
	met.StaleAfter = max(5*time.Second, 10**interval)
	defer o.ops.serve(log, met.Ready, met).Close()
	var nicLog agent.NICLog
	var vfLog agent.VFLog
	err = agent.Run(ctx, a, nil, agent.NowNs(), interval.Nanoseconds(), func(s agent.Stats, ch agent.Changes, err error) {
		// The step's time: from its tick (s.NowNs) to now.
		met.Observe(s, time.Since(time.Unix(0, s.NowNs)), err)
		for _, w := range nicLog.Fresh(s) {
			log.Warn(w) // offloads off, an mq root replaced: once each
		}
		for _, w := range vfLog.Fresh(s) {
			log.Warn(w) // a VF not found or not set: once each
		}
		if th != nil && a.Policy() != thPolicy {
			// The agent took a new policy (this runs on its goroutine).
			thPolicy = a.Policy()
			th.SetPolicy(thPolicy)
		}
		if side != nil {
			side.SetStats(s)
		}
		if werr := agent.WriteStats(*stateDir, s); werr != nil && werr.Error() != lastErr {
			log.Error("stats: " + labOneLine(werr))
			lastErr = werr.Error()
		}
		if err != nil && err.Error() != lastErr {
			log.Error(labOneLine(err))
			lastErr = err.Error()
		}
		if err != nil && ns != "" {
			if _, serr := os.Stat("/run/netns/" + ns); serr != nil {
				nsGone = true // the lab went down: nothing left to control
				stop()
			}
		}
	})
	if nsGone {
		log.Error(fmt.Sprintf("network namespace %s is gone; exiting", ns))
		return exitBad
	}
	if e := invErr(); e != nil {
		log.Error(labOneLine(e) + "; exiting (a restarted agent resumes without disturbing traffic)")
		return exitBad
	}
	if err != nil {
		log.Error(labOneLine(err))
		return exitBad
	}
	return exitOK
}

// gatewayStatusMaxAge: a gateway status file older than this is not
// read for measured capacities (the gateway stopped).
const gatewayStatusMaxAge = 30 * time.Second

// startThrottler starts the throttle driver for the datastores of
// --datastore DS=DIR whose driver is throttle (policy.Datastore.DriverAt:
// the file's driver, else gateway where DIR holds the gateway's stats
// volume, else throttle), with its own connection to libvirtd at socket.
// It returns nil when every datastore given is the gateway's.
func startThrottler(p *policy.Policy, host string, dss, probeFlags []string, socket, stateDir string, domain func(string) string, logf func(string, ...any)) (*agent.Throttler, func(), error) {
	probeOf := map[string]string{}
	for _, a := range probeFlags {
		name, how, ok := strings.Cut(a, "=")
		if !ok || name == "" {
			return nil, nil, fmt.Errorf("--datastore-probe %q: want DS=dir, DS=none or DS=nbd+unix:///EXPORT?socket=PATH", a)
		}
		probeOf[name] = how
	}
	var list []agent.ThrottleDatastore
	var closers []func() error
	closeAll := func() {
		for _, c := range closers {
			_ = c()
		}
	}
	for _, a := range dss {
		name, dir, ok := strings.Cut(a, "=")
		dir = strings.TrimPrefix(dir, "dir:")
		if !ok || name == "" || !filepath.IsAbs(dir) {
			return nil, nil, fmt.Errorf("--datastore %q: want DS=DIR (an absolute directory)", a)
		}
		ds := p.Datastore(name)
		if ds == nil {
			return nil, nil, fmt.Errorf("--datastore %s: no datastore %s in the policy", a, name)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, nil, fmt.Errorf("--datastore %s: %s is not a directory (is the datastore mounted?)", a, dir)
		}
		_, err := os.Stat(filepath.Join(dir, storage.StatsVolume))
		if drv := ds.DriverAt(err == nil); drv != policy.DriverThrottle {
			logf("datastore %s: driver %s (the gateway controls it)", name, drv)
			continue
		}
		tds := agent.ThrottleDatastore{Name: name, Dir: dir}
		switch how := probeOf[name]; {
		case how == "" || how == "dir":
			pr, err := agent.NewDirProber(dir)
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("--datastore %s: %w", a, err)
			}
			tds.Probe, closers = pr, append(closers, pr.Close)
		case how == "none":
		case strings.HasPrefix(how, "nbd+unix:///"):
			u, err := url.Parse(how)
			if err != nil || u.Query().Get("socket") == "" {
				closeAll()
				return nil, nil, fmt.Errorf("--datastore-probe %s=%s: want nbd+unix:///EXPORT?socket=PATH", name, how)
			}
			pr := &agent.NBDProber{Network: "unix", Addr: u.Query().Get("socket"), Export: strings.TrimPrefix(u.Path, "/")}
			tds.Probe, closers = pr, append(closers, pr.Close)
		default:
			closeAll()
			return nil, nil, fmt.Errorf("--datastore-probe %s=%s: want dir, none or nbd+unix:///EXPORT?socket=PATH", name, how)
		}
		list = append(list, tds)
	}
	if len(list) == 0 {
		return nil, func() {}, nil
	}
	conn, err := virt.Dial(socket)
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("throttle driver: %w", err)
	}
	th, err := agent.NewThrottler(p, host, conn, list, stateDir)
	if err != nil {
		conn.Close()
		closeAll()
		return nil, nil, err
	}
	th.Domain = domain
	return th, func() { conn.Close(); closeAll() }, nil
}

// labDomains names a lab guest's domain (sl-CLUSTER-VM) for an agent
// with the lab's inventory; nil (the VM's own name) for libvirt's.
func labDomains(kind, cluster string) func(string) string {
	if kind != "lab" {
		return nil
	}
	return func(vm string) string { return lab.NamespacePrefix(cluster) + vm }
}

func runAgentStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("agent status")
	host := fs.String("host", "", "host name")
	file := fs.String("policy", "", "policy file (to find the cluster)")
	out := fs.String("o", "table", "table or json")
	stateDir := fs.String("state-dir", lab.DefaultStateDir, "directory of the statistics file")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *host == "" || (*out != "table" && *out != "json") {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		agentUsage(stderr)
		return exitUsage
	}
	cluster := ""
	if *file != "" {
		p, code := loadPolicy(*file, stderr)
		if p == nil {
			return code
		}
		cluster = p.Cluster
	}
	s, err := agent.ReadStats(*stateDir, cluster, *host)
	if err != nil {
		fmt.Fprintf(stderr, "sluice agent status: %s\n", labOneLine(err))
		return exitBad
	}
	if *out == "json" {
		b, _ := json.MarshalIndent(s, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	age := time.Since(time.Unix(0, s.NowNs)).Round(time.Millisecond)
	fmt.Fprintf(stdout, "host %s (cluster %s) dynamic=%v, updated %s ago\n", s.Host, s.Cluster, s.Dynamic, age)
	if len(s.Unnamed) > 0 {
		fmt.Fprintf(stdout, "unnamed: %s (running, not in the policy: a class per vNIC on an uplink's bridge, with the policy's unnamedVMs)\n", strings.Join(s.Unnamed, " "))
	}
	for _, u := range s.Uplinks {
		fmt.Fprintf(stdout, "uplink %s (%s) speed %s usable %s\n", u.Uplink, u.Dev, policy.FormatRate(policy.Bps(u.SpeedBps)), policy.FormatRate(policy.Bps(u.UsableBps)))
		writeNICStatus(stdout, u.NIC, "  ")
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PORT\tCLASSID\tBYTES\tPACKETS\tDROPS\tQUEUED\tRATE Mbps\tENTITLED Mbps\tHTB RATE Mbps\tCEIL Mbps\t")
		for _, pt := range u.Ports {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", pt.Port, pt.ClassID, pt.Bytes, pt.Packets, pt.Drops, pt.Queued,
				pt.RateBps/1e6, pt.EntitlementBps/1e6, float64(pt.GuaranteeBps)/1e6, float64(pt.CeilBps)/1e6)
		}
		tw.Flush()
	}
	writeCPUStatus(stdout, s)
	if ts, err := agent.ReadThrottleStatus(agent.ThrottleStatusPath(*stateDir, s.Cluster, s.Host)); err == nil {
		writeThrottleStatus(stdout, ts)
	}
	return exitOK
}

// writeThrottleStatus prints the throttle driver's last period (its
// status file): each datastore's budget, latencies and measured
// capacity, and each disk's I/O and QEMU throttle.
func writeThrottleStatus(w io.Writer, ts agent.ThrottleStatus) {
	age := time.Since(time.Unix(0, ts.TimeUnixNs)).Round(time.Millisecond)
	fmt.Fprintf(w, "throttle driver: period %.1fs, updated %s ago\n", ts.PeriodS, age)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DATASTORE\tSIOC\tWINDOW\tBUDGET IOPS\tLATENCY ms\tHOST LATENCY ms\tTHRESHOLD ms\tHOSTS\tMEASURED CAPACITY\t")
	for _, d := range ts.Datastores {
		budget := "unbounded"
		if d.BudgetIOPS >= 0 {
			budget = fmt.Sprintf("%.0f", d.BudgetIOPS)
		}
		fmt.Fprintf(tw, "%s\t%v\t%.2f\t%s\t%.2f\t%.2f\t%.0f\t%d\t%s\t\n", d.Name, d.SIOC, d.Window, budget, d.DatastoreLatencyMs,
			d.HostLatencyMs, d.ThresholdMs, d.HostsSeen, measuredText(d.MeasuredIOPS, d.CapacityPeriods))
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DISK\tVM\tTARGET\tIOPS\tLATENCY ms\tENTITLED IOPS\tTHROTTLE IOPS\tWHY\t")
	for _, d := range ts.Disks {
		ent, thr := "unbounded", "none"
		if d.EntitlementIOPS >= 0 {
			ent = fmt.Sprintf("%.0f", d.EntitlementIOPS)
		}
		if d.ThrottleIOPS > 0 {
			thr = fmt.Sprintf("%d", d.ThrottleIOPS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%.2f\t%s\t%s\t%s\t\n", d.Disk, d.VM, d.Target, d.IOPS, d.LatencyMs, ent, thr, d.Why)
	}
	tw.Flush()
	for _, d := range ts.Datastores {
		if d.Error != "" {
			fmt.Fprintf(w, "datastore %s: %s\n", d.Name, d.Error)
		}
	}
}

// writeNICStatus prints an uplink's NIC as the agent last read it, each
// line after indent: what it is, the root qdisc sluice replaced, what is
// unknown, a read's error, the warnings.
func writeNICStatus(w io.Writer, n *agent.UplinkNIC, indent string) {
	if n == nil {
		return
	}
	fmt.Fprintf(w, "%snic: %s\n", indent, n.Summary())
	if n.RootBefore != "" {
		fmt.Fprintf(w, "%snic: root qdisc before sluice: %s\n", indent, n.RootBefore)
	}
	if len(n.Unknown) > 0 {
		fmt.Fprintf(w, "%snic: unknown: %s\n", indent, strings.Join(n.Unknown, "; "))
	}
	if n.Error != "" {
		fmt.Fprintf(w, "%snic: error: %s\n", indent, n.Error)
	}
	for _, x := range n.Warnings {
		fmt.Fprintf(w, "%swarning: %s\n", indent, x)
	}
}

// writeCPUStatus prints the VMs' CPU (agent --cpu): what the agent set and
// what each VM used over the last interval, in percent of one core.
func writeCPUStatus(w io.Writer, s *agent.Stats) {
	if len(s.CPU) == 0 {
		return
	}
	fmt.Fprintf(w, "cpu: %.0f MHz shared\n", s.CPUCapacityMHz)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "VM\tENTITLED MHz\tREASON\tWEIGHT\tSHARES\tCPU.MAX\tUSED %\tTHROTTLED %\tREADY %\tPSI %\t")
	for _, c := range s.CPU {
		psi := "-"
		if c.PressurePct > 0 {
			psi = fmt.Sprintf("%.1f", c.PressurePct)
		}
		reason := c.Reason
		if c.Cores != "" {
			reason += " " + c.Cores // a latency-sensitive VM's own cores
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%d\t%d\t%s\t%.1f\t%.1f\t%.1f\t%s\t\n", c.VM, c.EntitlementMHz, reason, c.Weight, c.Shares,
			c.CPUMax, c.UsedPct, c.ThrottledPct, c.ReadyPct, psi)
	}
	tw.Flush()
	for _, c := range s.CPU {
		if c.Err != "" {
			fmt.Fprintln(w, c.Err)
		}
	}
}

// agentNetns is the network namespace the agent works in: --netns, else
// the host's lab namespace when it exists, else the current one ("").
func agentNetns(flagNS, cluster, host string) string {
	if flagNS != "" {
		return flagNS
	}
	cand := lab.NamespacePrefix(cluster) + host
	if _, err := os.Stat("/run/netns/" + cand); err == nil {
		return cand
	}
	return ""
}

// runAgentUninstall gives the host back what the agent took: the recorded
// root qdisc of every uplink, and no sluice classifier (nor the clsact it
// added) on the vNICs. Running it twice is harmless.
func runAgentUninstall(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("agent uninstall")
	host := fs.String("host", "", "host name of the policy")
	file := fs.String("policy", "", "policy file")
	nsName := fs.String("netns", "", "network namespace of the host (default: sl-<cluster>-<host> when it exists, else the current one)")
	stateDir := fs.String("state-dir", lab.DefaultStateDir, "directory of the agent's state file (the agent's --state-dir)")
	kernelDefault := fs.Bool("kernel-default", false, "give an uplink whose replaced root qdisc is recorded nowhere the kernel's default (else: an error, sluice's root stays)")
	var src inventoryFlags
	src.register(fs)
	config := addConfigFlag(fs, "agent")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	// The agent's config file gives uninstall the agent's host, policy,
	// inventory, uplinks and state directory; its other flags are not
	// uninstall's.
	agentFS, _ := newAgentFlags()
	if err := config.apply(fs, agentFS); err != nil {
		fmt.Fprintf(stderr, "sluice agent uninstall: %v\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 || *host == "" || *file == "" || !src.valid() {
		agentUsage(stderr)
		return exitUsage
	}
	p, err := policy.Load(*file)
	if err != nil {
		fmt.Fprintln(stderr, labOneLine(err))
		return exitBad
	}
	if p.Host(*host) == nil {
		fmt.Fprintf(stderr, "sluice agent uninstall: host %q is not in %s\n", *host, *file)
		return exitBad
	}
	// What sluice set through libvirt, given back from the originals it
	// recorded: the disks' QEMU throttles, then the vCPU pinnings of
	// latency-sensitive VMs and of the domains kept off their cores.
	giveBack := func(what, originals string, undo func(*virt.Libvirt) ([]string, error)) bool {
		if !fileExists(originals) {
			return true
		}
		conn, err := virt.Dial(src.socket)
		if err != nil {
			fmt.Fprintf(stderr, "sluice agent uninstall: %s: %s\n", what, labOneLine(err))
			return false
		}
		done, err := undo(conn)
		conn.Close()
		for _, d := range done {
			fmt.Fprintln(stdout, d)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice agent uninstall: %s\n", labOneLine(err))
			return false
		}
		return true
	}
	if !giveBack("throttles", agent.ThrottleOriginalsPath(*stateDir, p.Cluster, *host), func(c *virt.Libvirt) ([]string, error) {
		return agent.UninstallThrottles(c, *stateDir, p.Cluster, *host, labDomains(src.kind, p.Cluster))
	}) || !giveBack("pins", agent.PinsOriginalsPath(*stateDir, p.Cluster, *host), func(c *virt.Libvirt) ([]string, error) {
		return agent.UninstallPins(c.Pinner(), agent.PinsOriginalsPath(*stateDir, p.Cluster, *host))
	}) {
		return exitBad
	}
	k, err := agent.NewNetlinkKernel(src.netns(*nsName, p.Cluster, *host))
	if err != nil {
		fmt.Fprintf(stderr, "sluice agent uninstall: %s\n", labOneLine(err))
		return exitBad
	}
	defer k.Close()
	// The devices of the host's inventory are cleaned too when the state
	// file is lost.
	uplinks, vnics := src.devices(p, *host)
	path := agent.RecordPath(*stateDir, p.Cluster, *host)
	rec, err := agent.ReadRecord(path)
	if err != nil {
		fmt.Fprintf(stderr, "sluice agent uninstall: %s\n", labOneLine(err))
		return exitBad
	}
	done, err := agent.Uninstall(k, rec, agent.UninstallOptions{RootsDir: agent.DefaultRootsDir, KernelDefault: *kernelDefault}, uplinks, vnics)
	// Every SR-IOV VF sluice set gets the rates it had before.
	vfDone, vfErr := agent.UninstallVFs(k, agent.VFOriginalsPath(*stateDir, p.Cluster, *host))
	done = append(done, vfDone...)
	err = errors.Join(err, vfErr)
	for _, d := range done {
		fmt.Fprintln(stdout, d)
	}
	if errors.Is(err, agent.ErrRootUnknown) {
		fmt.Fprintf(stderr, "sluice agent uninstall: %s (no state file %s, nothing in %s): pass the agent's --state-dir, or --kernel-default to let the kernel attach its default root\n", labOneLine(err), path, agent.DefaultRootsDir)
		return exitBad
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice agent uninstall: %s\n", labOneLine(err))
		return exitBad
	}
	if len(done) == 0 {
		fmt.Fprintf(stdout, "host %s: nothing of sluice's left to remove\n", *host)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		fmt.Fprintf(stderr, "sluice agent uninstall: %v\n", err)
		return exitBad
	}
	return exitOK
}
