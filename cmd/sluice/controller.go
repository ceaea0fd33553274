package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sluice/console"
	"sluice/controller"
	"sluice/internal/ops"
)

func init() {
	register(command{name: "controller", summary: "the cluster controller: state in etcd, HTTPS API for ctl and agents", run: runController})
	helps["controller"] = `usage: sluice controller [--data-dir DIR] [--listen ADDR:PORT] [--tls-cert FILE --tls-key FILE] [--tokens FILE]
                         [--etcd-endpoints URL,... [--etcd-cert F --etcd-key F] [--etcd-ca F]] [--prefix /sluice/] [--placement=true|false]
                         [--host-ttl 10] [--drs manual|automatic] [--drs-interval 30s] [--rebalance-threshold 1..5]
                         [--max-events N] [--max-decisions N] [--event-ttl 168h] [--max-conns 8192] [--max-conns-per-addr 256]
                         [--host-seats 64] [--operator-seats 16]
                         [--etcd-client-port N] [--etcd-peer-port N] (both obsolete, ignored)
                         [--metrics-listen 127.0.0.1:9643|""] [--log-format text|json] [--config /etc/sluice/controller.yaml]

The cluster controller. It keeps the cluster's state (policy, placement,
hosts, desired state per host, decisions, events) in etcd: a member
embedded in the controller with its data in DIR/etcd, listening only on
the Unix socket DIR/etcd/client.sock (in a 0700 directory: no other user
can reach it), or the external cluster of --etcd-endpoints (secure it
yourself: TLS with client certificates; --etcd-cert, --etcd-key and
--etcd-ca are the controller's). It serves the API of api/openapi.yaml
over HTTPS on --listen (default 127.0.0.1:7443): with the certificate
given, else one generated into DIR/tls at first start. Every request
needs a bearer token of --tokens (one per line; "TOKEN host=h1" is the
token of h1's agent only, see sluice ctl token; SIGHUP reads the file
again), else the one generated into DIR/token (mode 0600).
--placement=false: a power-on without a host goes to the VM's policy
host instead of where placement puts it. --drs: what becomes of
placement's repairs of a fault (a change that breaks a host's
reservations) and of the periodic pass (every --drs-interval;
--rebalance-threshold 2..5 also rebalances, 1 only repairs): manual
records them as recommended decisions that sluice ctl approve carries
out; automatic carries them out at once (the agents move the VMs). At
most --max-events events are kept (each change deletes the oldest
beyond it); events older than --event-ttl, and decisions older than it
that are not under way, are deleted every minute, as are the oldest
finished decisions beyond --max-decisions. The API holds at most
--max-conns connections, --max-conns-per-addr from one address (raise it
for hosts behind one NAT address). It serves at most --host-seats
requests of hosts' tokens and --operator-seats of operators' tokens at
once; the others wait, in a queue per host and per operator token
served in turn (at most 64 requests each, for at most 10 s; beyond,
429). --metrics-listen: Prometheus metrics on /metrics, /healthz and
/readyz (ready while etcd answers), loopback by default; "" for none. The log (stderr) is log/slog text, or
JSON with --log-format json. See docs/controller.md.

example:
  sluice controller --data-dir /var/lib/sluice/controller`
}

// defaultDataDir is the controller's data directory, and where `sluice
// ctl` finds its token and certificate on the same machine.
func defaultDataDir() string {
	if d := os.Getenv("SLUICE_CONTROLLER_DIR"); d != "" {
		return d
	}
	return "/var/lib/sluice/controller"
}

const defaultListen = "127.0.0.1:7443"

// etcdCheckEvery is the period of the controller's etcd check (the
// sluice_controller_etcd_up metric).
const etcdCheckEvery = 10 * time.Second

func runController(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("controller")
	dataDir := fs.String("data-dir", defaultDataDir(), "data directory")
	listen := fs.String("listen", defaultListen, "API address")
	cert := fs.String("tls-cert", "", "TLS certificate (PEM)")
	key := fs.String("tls-key", "", "TLS key (PEM)")
	tokensFile := fs.String("tokens", "", "bearer tokens, one per line")
	endpoints := fs.String("etcd-endpoints", "", "external etcd cluster")
	etcdCert := fs.String("etcd-cert", "", "client certificate for the external etcd (PEM)")
	etcdKey := fs.String("etcd-key", "", "its key (PEM)")
	etcdCA := fs.String("etcd-ca", "", "CA of the external etcd's certificates (PEM)")
	// Obsolete: the embedded member listens on a Unix socket only. Still
	// accepted so that older command lines start.
	fs.Int("etcd-client-port", 0, "obsolete, ignored")
	fs.Int("etcd-peer-port", 0, "obsolete, ignored")
	prefix := fs.String("prefix", "/sluice/", "etcd key prefix")
	choose := fs.Bool("placement", true, "placement chooses the host of a power-on")
	ttl := fs.Int64("host-ttl", 10, "lease of a registered host, seconds")
	drs := fs.String("drs", "manual", "manual (recommend; ctl approve) or automatic")
	drsEvery := fs.Duration("drs-interval", 30*time.Second, "period of the DRS pass (0: none)")
	threshold := fs.Int("rebalance-threshold", 1, "migration threshold of the DRS pass: 1 repairs only, 2..5 also rebalance")
	maxEvents := fs.Int("max-events", controller.DefaultMaxEvents, "events kept at most")
	maxDecisions := fs.Int("max-decisions", controller.DefaultMaxDecisions, "finished decisions kept at most")
	eventTTL := fs.Duration("event-ttl", controller.DefaultEventTTL, "age from which events and finished decisions are deleted")
	maxConns := fs.Int("max-conns", controller.MaxConns, "API connections open at once")
	maxConnsAddr := fs.Int("max-conns-per-addr", controller.MaxConnsPerIP, "API connections open at once from one address")
	hostSeats := fs.Int("host-seats", controller.DefaultHostSeats, "API requests of hosts' tokens served at once")
	opSeats := fs.Int("operator-seats", controller.DefaultOperatorSeats, "API requests of operators' tokens served at once")
	var opsf opsFlags
	opsf.register(fs, ops.DefaultControllerMetrics)
	config := addConfigFlag(fs, "controller")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice controller: unexpected argument %s; see 'sluice controller --help'\n", fs.Arg(0))
		return exitUsage
	}
	if err := config.apply(fs, nil); err != nil {
		fmt.Fprintf(stderr, "sluice controller: %v\n", err)
		return exitUsage
	}
	mode, err := controller.ParseDRSMode(*drs)
	if err != nil || *threshold < 1 || *threshold > 5 || *drsEvery < 0 {
		fmt.Fprintln(stderr, "sluice controller: --drs manual|automatic, --rebalance-threshold 1..5, --drs-interval ≥ 0 (sluice controller --help)")
		return exitUsage
	}
	if *maxEvents < 1 || *maxDecisions < 1 || *eventTTL <= 0 {
		fmt.Fprintln(stderr, "sluice controller: --max-events and --max-decisions ≥ 1, --event-ttl > 0 (sluice controller --help)")
		return exitUsage
	}
	if *maxConns < 1 || *maxConnsAddr < 1 || *maxConnsAddr > *maxConns {
		fmt.Fprintln(stderr, "sluice controller: --max-conns ≥ 1 and 1 ≤ --max-conns-per-addr ≤ --max-conns (sluice controller --help)")
		return exitUsage
	}
	if *hostSeats < 1 || *opSeats < 1 {
		fmt.Fprintln(stderr, "sluice controller: --host-seats and --operator-seats ≥ 1 (sluice controller --help)")
		return exitUsage
	}
	if *ttl <= 0 {
		fmt.Fprintln(stderr, "sluice controller: --host-ttl must be positive (sluice controller --help)")
		return exitUsage
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		fmt.Fprintf(stderr, "sluice controller: --listen %s: want ADDR:PORT (sluice controller --help)\n", *listen)
		return exitUsage
	}
	if err := opsf.check(); err != nil {
		fmt.Fprintf(stderr, "sluice controller: %v (sluice controller --help)\n", err)
		return exitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice controller: "+format+"\n", a...)
		return exitBad
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fail("%v", err)
	}
	// A data directory made before (or by hand) gets the mode too: it
	// holds the key, the token and the state.
	if err := os.Chmod(*dataDir, 0o700); err != nil {
		return fail("%v", err)
	}
	certPath, keyPath, err := controller.EnsureCert(*cert, *key, *dataDir)
	if err != nil {
		return fail("TLS: %v", err)
	}
	toks, err := controller.LoadTokens(*tokensFile, *dataDir)
	if err != nil {
		return fail("tokens: %v", err)
	}
	ec := controller.EtcdConfig{Dir: filepath.Join(*dataDir, "etcd"), CertFile: *etcdCert, KeyFile: *etcdKey, CAFile: *etcdCA}
	if *endpoints != "" {
		ec.Endpoints = strings.Split(*endpoints, ",")
	} else if *etcdCert != "" || *etcdKey != "" || *etcdCA != "" {
		fmt.Fprintln(stderr, "sluice controller: --etcd-cert, --etcd-key and --etcd-ca are for an external etcd (--etcd-endpoints) (sluice controller --help)")
		return exitUsage
	}
	e, err := controller.OpenEtcd(ec)
	if err != nil {
		return fail("%s", strings.Join(strings.Fields(err.Error()), " "))
	}
	defer e.Close()
	where := "external etcd " + *endpoints
	if e.Embedded != nil {
		where = fmt.Sprintf("embedded etcd in %s (unix://%s)", ec.Dir, filepath.Join(ec.Dir, controller.EtcdSocket))
	}
	c := controller.New(controller.Config{Client: e.Client, Prefix: *prefix, ChooseHosts: *choose, HostTTLSeconds: *ttl,
		DRS: mode, RebalanceThreshold: *threshold, MaxEvents: *maxEvents, MaxDecisions: *maxDecisions, EventTTL: *eventTTL})
	if n, err := c.Republish(context.Background()); err != nil {
		fmt.Fprintf(stderr, "sluice controller: the hosts' desired states were not checked at start: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(stderr, "sluice controller: rewrote %d host desired state(s) written by another version\n", n)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail("%v", err)
	}
	logger := opsf.logger(stderr, "controller")
	// The web console's files under /ui/ beside the API (docs/operate.md).
	srv := controller.NewHTTPServerLimits(*listen, console.Handler(controller.HandlerLimits(c, toks, slog.NewLogLogger(logger.Handler(), slog.LevelError),
		controller.Fairness{HostSeats: *hostSeats, OperatorSeats: *opSeats})), *maxConns, *maxConnsAddr)
	// The signals are caught before the controller says it is ready.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	// SIGHUP reads the tokens file again: a token added or revoked
	// takes effect without a restart; a file that does not parse leaves
	// the tokens as they were.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			n, err := controller.LoadTokens(*tokensFile, *dataDir)
			if err != nil {
				logger.Error(fmt.Sprintf("SIGHUP: tokens kept as they were: %v", err))
				continue
			}
			toks.Replace(n)
			all, hosts := n.Len()
			logger.Info(fmt.Sprintf("SIGHUP: %d tokens read (%d of hosts)", all, hosts))
		}
	}()
	fmt.Fprintf(stdout, "sluice controller: %s ready in %v; API on https://%s (certificate %s)\n", where, e.StartTime.Round(time.Millisecond), l.Addr(), certPath)
	logger.Info(fmt.Sprintf("web console on https://%s%s (an operator's token signs in)", l.Addr(), console.Prefix))
	bg, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.RunPrune(bg, time.Minute, ops.Logf(logger, slog.LevelWarn))
	if *drsEvery > 0 {
		go c.RunDRS(bg, *drsEvery, ops.Logf(logger, slog.LevelWarn))
	}
	// etcd_up between readiness probes; /readyz checks etcd itself.
	go c.RunHealth(bg, etcdCheckEvery)
	defer opsf.serve(logger, c.Ready, c.Collector()).Close()
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(l, certPath, keyPath) }()
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err.Error())
			return exitBad
		}
	case s := <-sig:
		fmt.Fprintf(stdout, "sluice controller: %v: stopping\n", s)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
	return exitOK
}
