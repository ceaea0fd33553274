// Package ops is what an operator sees of a sluice daemon besides its
// work: Prometheus metrics, liveness and readiness served on an address
// of their own, and structured logs (log/slog) with time, level and
// component. The daemons (sluice agent, gateway, controller) wire it;
// their packages provide the collectors and the readiness checks. It must
// not be imported by the pure core packages (alloc, hclock, mclock, parda,
// placement, feasible).
package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Default metrics addresses of the daemons: loopback only. An operator
// who scrapes from another machine gives --metrics-listen ADDR:PORT.
const (
	DefaultAgentMetrics      = "127.0.0.1:9641"
	DefaultGatewayMetrics    = "127.0.0.1:9642"
	DefaultControllerMetrics = "127.0.0.1:9643"
)

// ReadyTimeout bounds one readiness check (/readyz).
const ReadyTimeout = 2 * time.Second

// NewLogger returns a logger writing to w in format "text" (the default,
// for "") or "json", every record with its time, level and the attribute
// component.
func NewLogger(w io.Writer, format, component string) (*slog.Logger, error) {
	var h slog.Handler
	switch format {
	case "", "text":
		h = slog.NewTextHandler(w, nil)
	case "json":
		h = slog.NewJSONHandler(w, nil)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return slog.New(h).With("component", component), nil
}

// Logf adapts l to the printf-style callbacks of the packages (Logf
// options): each line is one record at level. A leading "PREFIX: " equal
// to one of strip is dropped, since the component attribute says it.
func Logf(l *slog.Logger, level slog.Level, strip ...string) func(format string, args ...any) {
	return func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		for _, p := range strip {
			if rest, ok := strings.CutPrefix(msg, p+": "); ok {
				msg = rest
				break
			}
		}
		l.Log(context.Background(), level, msg)
	}
}

// NewRegistry returns a registry with the Go runtime's and the process's
// metrics and sluice_build_info{version,revision,goversion} = 1.
func NewRegistry(version, revision, goVersion string) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "The sluice binary: version, VCS revision and Go version (value 1).",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion},
	})
	info.Set(1)
	r.MustRegister(info)
	return r
}

// Ready tells whether a daemon is ready to do its work: nil, or why not.
type Ready func(ctx context.Context) error

// Handler serves /metrics (the registry, in Prometheus's formats),
// /healthz (liveness: the process answers) and /readyz (ready: 200 "ok",
// else 503 and the reason in one line).
func Handler(reg prometheus.Gatherer, ready Ready, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	opts := promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}
	if log != nil {
		opts.ErrorLog = errorLog{log}
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, opts))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var err error
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
			err = ready(ctx)
			cancel()
		}
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: "+oneLine(err.Error()))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// errorLog passes promhttp's errors (a collector that failed) to slog.
type errorLog struct{ l *slog.Logger }

func (e errorLog) Println(v ...any) { e.l.Warn("metrics: " + oneLine(fmt.Sprint(v...))) }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Server serves Handler on an address of its own.
type Server struct {
	srv *http.Server
	l   net.Listener
}

// CheckAddr checks a --metrics-listen value: "" (none) or HOST:PORT.
func CheckAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--metrics-listen %s: want ADDR:PORT (e.g. 127.0.0.1:9641), or \"\" for none", addr)
	}
	return nil
}

// Listen opens addr and serves h there until Close. addr "" serves
// nothing: Listen returns nil and no error.
func Listen(addr string, h http.Handler) (*Server, error) {
	if addr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	s := &Server{l: l, srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// Addr is the address served on (a port 0 resolved).
func (s *Server) Addr() string {
	if s == nil {
		return ""
	}
	return s.l.Addr().String()
}

// Close stops serving; requests under way get up to a second.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
