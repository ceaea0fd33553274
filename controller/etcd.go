package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Files of the embedded etcd member in its directory (EtcdConfig.Dir).
const (
	// EtcdSocket is the member's client endpoint: a Unix socket in the
	// member's directory (mode 0700), so that only the controller's user
	// (and root) can reach it, e.g. etcdctl --endpoints unix://DIR/client.sock.
	EtcdSocket = "client.sock"
)

// A change is one transaction that also publishes every host's desired
// state that changed and carries the policy document: with 1,000 hosts
// and 30,000 VMs an apply is ~1,000 operations and ~7 MiB, beyond etcd's
// defaults (128 operations, 1.5 MiB). The embedded member takes these
// limits; an external cluster needs them too (etcd --max-txn-ops
// --max-request-bytes), and the client sends requests up to MaxTxnBytes.
const (
	MaxTxnOps   = 10_000   // a desired state per host (policy: ≤ 1,000 hosts), events, decisions
	MaxTxnBytes = 32 << 20 // the document (≤ 8 MiB, escaped in JSON), the placement, every host's desired state
	// AutoCompactionRetention is the history the embedded member keeps
	// (etcd --auto-compaction-retention for an external cluster).
	AutoCompactionRetention = "5m"
)

// EtcdConfig says where the cluster state lives: an etcd member embedded
// in the controller (Endpoints empty) or an external etcd cluster.
type EtcdConfig struct {
	// Endpoints of an external etcd cluster (http://H:P or https://H:P).
	// Empty: embed one member whose data is in Dir.
	Endpoints []string
	// Dir is the embedded member's directory (made mode 0700): its data,
	// its log and its client socket (EtcdSocket). The member listens on
	// nothing else: no TCP port, no peer endpoint (a single member has no
	// peers).
	Dir string
	// CertFile, KeyFile and CAFile are the client certificate, its key
	// and the CA that signs the external cluster's certificates (PEM);
	// empty: no client certificate, the system's roots.
	CertFile, KeyFile, CAFile string
	// UnsafeNoFsync turns fsync off in the embedded member (tests only:
	// a crash of the machine may lose acknowledged writes).
	UnsafeNoFsync bool
	// StartTimeout bounds the start of the embedded member or the first
	// contact with an external cluster; 0 means 60 s.
	StartTimeout time.Duration
}

// Etcd is an open connection to the state store, with the embedded member
// when there is one.
type Etcd struct {
	Client *clientv3.Client
	// Embedded is the in-process member, nil with an external cluster.
	Embedded *embed.Etcd
	// StartTime is how long the start (or first contact) took.
	StartTime time.Duration

	stopping *atomic.Bool // the embedded member is stopping (quietStop)
	log      *zap.Logger  // the embedded member's
}

// OpenEtcd starts the embedded member or connects to the external cluster
// and returns when it can serve requests.
func OpenEtcd(cfg EtcdConfig) (*Etcd, error) {
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	start := time.Now()
	if len(cfg.Endpoints) > 0 {
		tc, err := clientTLS(cfg)
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: timeout, Logger: quietLogger(),
			MaxCallSendMsgSize: MaxTxnBytes + 1<<20, TLS: tc})
		if err != nil {
			return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if _, err := c.Get(ctx, "sluice-ping"); err != nil {
			c.Close()
			return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
		}
		return &Etcd{Client: c, StartTime: time.Since(start)}, nil
	}
	if cfg.Dir == "" {
		return nil, errors.New("etcd: no data directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	// A directory made before keeps its mode: set it (it holds the
	// socket, through which the state can be read and written).
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	sock := filepath.Join(dir, EtcdSocket)
	if len(sock) > 107 {
		return nil, fmt.Errorf("etcd: socket path %s is longer than 107 bytes: give a shorter data directory", sock)
	}
	ec := embed.NewConfig()
	ec.Name = "sluice"
	ec.Dir = filepath.Join(dir, "member-data")
	cu := url.URL{Scheme: "unix", Path: sock}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	// No peer listener: the member's peer URL is only its name in the
	// cluster's membership, never listened on nor dialled.
	pu := url.URL{Scheme: "unix", Host: "sluice-no-peers"}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = nil, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel = "warn"
	ec.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	stopping := &atomic.Bool{}
	lg, err := etcdLogger(ec.LogOutputs[0], stopping)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.MaxTxnOps, ec.MaxRequestBytes = MaxTxnOps, MaxTxnBytes
	// Every set rewrites the policy document and every report its host's
	// key: without compaction the history grows until etcd's quota
	// (2 GiB) stops all writes. Keep AutoCompactionRetention of history.
	ec.AutoCompactionMode, ec.AutoCompactionRetention = embed.CompactorModePeriodic, AutoCompactionRetention
	e, err := embed.StartEtcd(ec)
	if err != nil {
		_ = lg.Sync()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(timeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready after %v (see %s)", timeout, ec.LogOutputs[0])
	}
	return &Etcd{Client: v3client.New(e.Server), Embedded: e, StartTime: time.Since(start), stopping: stopping, log: lg}, nil
}

// etcdLogger is the embedded member's logger: etcd's own format and level
// (warn) into path, without the errors etcd logs about its listeners
// closing once stopping is set (a clean stop is not an error).
func etcdLogger(path string, stopping *atomic.Bool) (*zap.Logger, error) {
	cfg := logutil.DefaultZapLoggerConfig
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.OutputPaths, cfg.ErrorOutputPaths = []string{path}, []string{path}
	return cfg.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quietStop{c, stopping} }))
}

// stopNoise are the messages etcd logs, as errors and warnings, when the
// member's listeners close on a clean stop.
var stopNoise = map[string]bool{
	"setting up serving from embedded etcd failed.": true,
	"stopping insecure grpc server due to error":    true,
	"stopped insecure grpc server due to error":     true,
}

// quietStop drops stopNoise once stopping is set.
type quietStop struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (q quietStop) With(f []zapcore.Field) zapcore.Core { return quietStop{q.Core.With(f), q.stopping} }

func (q quietStop) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.stopping.Load() && stopNoise[e.Message] {
		return ce
	}
	return q.Core.Check(e, ce)
}

// Close closes the client and stops the embedded member.
func (e *Etcd) Close() error {
	err := e.Client.Close()
	if e.Embedded != nil {
		// The in-process client reports its own cancellation on Close.
		e.stopping.Store(true)
		e.Embedded.Close()
		_ = e.log.Sync()
		return nil
	}
	return err
}

type mvccKV = mvccpb.KeyValue

// txnHint says which etcd limit a refused transaction crossed: an
// external cluster's, since the embedded member takes MaxTxnOps and
// MaxTxnBytes.
func txnHint(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Sprintf(" (start etcd with --max-txn-ops %d)", MaxTxnOps)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Sprintf(" (start etcd with --max-request-bytes %d)", MaxTxnBytes)
	}
	return ""
}

func quietLogger() *zap.Logger { return zap.NewNop() }

// clientTLS is the TLS configuration of the client of an external
// cluster: nil without any of the files (an http:// cluster, or https://
// with the system's roots).
func clientTLS(cfg EtcdConfig) (*tls.Config, error) {
	if cfg.CertFile == "" && cfg.KeyFile == "" && cfg.CAFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	if cfg.CertFile != "" {
		kp, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", cfg.CAFile)
		}
	}
	return tc, nil
}
