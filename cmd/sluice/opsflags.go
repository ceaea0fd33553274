package main

import (
	"flag"
	"io"
	"log/slog"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/ops"
)

// opsFlags are what every daemon (agent, gateway, controller) has for its
// operators: where it serves /metrics, /healthz and /readyz, and the
// format of its log (docs/agent.md, "Metrics and health").
type opsFlags struct {
	metrics   string
	logFormat string
}

func (o *opsFlags) register(fs *flag.FlagSet, defaultAddr string) {
	fs.StringVar(&o.metrics, "metrics-listen", defaultAddr, `address of /metrics, /healthz and /readyz ("": none)`)
	fs.StringVar(&o.logFormat, "log-format", "text", "log format on stderr: text or json (log/slog: time, level, component)")
}

// check reports a bad --metrics-listen or --log-format (a usage error).
func (o *opsFlags) check() error {
	if err := ops.CheckAddr(o.metrics); err != nil {
		return err
	}
	_, err := ops.NewLogger(io.Discard, o.logFormat, "")
	return err
}

// logger is the daemon's logger on stderr (check first).
func (o *opsFlags) logger(stderr io.Writer, component string) *slog.Logger {
	l, err := ops.NewLogger(stderr, o.logFormat, component)
	if err != nil {
		l, _ = ops.NewLogger(stderr, "text", component)
	}
	return l
}

// serve serves the daemon's collectors, with the Go runtime's, the
// process's and sluice_build_info, and its readiness, on --metrics-listen
// until Close. An address it cannot listen on is logged and the daemon
// runs without metrics: its work never depends on them.
func (o *opsFlags) serve(log *slog.Logger, ready ops.Ready, cs ...prometheus.Collector) *ops.Server {
	if o.metrics == "" {
		return nil
	}
	b := readBuild()
	reg := ops.NewRegistry(b.version, b.revision, runtime.Version())
	reg.MustRegister(cs...)
	srv, err := ops.Listen(o.metrics, ops.Handler(reg, ready, log))
	if err != nil {
		log.Error(err.Error() + "; serving no metrics (give another address, or --metrics-listen \"\")")
		return nil
	}
	log.Info("metrics on http://" + srv.Addr() + "/metrics, health on /healthz and /readyz")
	return srv
}
