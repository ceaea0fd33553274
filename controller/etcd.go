package controller

import (
	"context"
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

// Default ports of the embedded etcd member: next to, never on, etcd's own
// 2379/2380, so that a controller can run beside a standalone etcd.
const (
	DefaultEtcdClientPort = 23790
	DefaultEtcdPeerPort   = 23800
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
	// Dir is the embedded member's data directory.
	Dir string
	// ClientPort and PeerPort are the embedded member's ports on
	// 127.0.0.1; 0 means the defaults above.
	ClientPort, PeerPort int
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
		c, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: timeout, Logger: quietLogger(),
			MaxCallSendMsgSize: MaxTxnBytes + 1<<20})
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
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cp, pp := cfg.ClientPort, cfg.PeerPort
	if cp == 0 {
		cp = DefaultEtcdClientPort
	}
	if pp == 0 {
		pp = DefaultEtcdPeerPort
	}
	ec := embed.NewConfig()
	ec.Name = "sluice"
	ec.Dir = filepath.Join(cfg.Dir, "member-data")
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel = "warn"
	ec.LogOutputs = []string{filepath.Join(cfg.Dir, "etcd.log")}
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
