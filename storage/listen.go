package storage

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sluice/storage/nbd"
)

// SocketPerm is who may connect to a gateway's Unix sockets: the socket
// file's owner, group and mode. Connecting needs write permission on the
// socket file (and search permission on its directories).
type SocketPerm struct {
	UID, GID int // -1: the gateway's own
	Mode     os.FileMode
}

// DefaultSocketPerm is the gateway's own user and group, mode 0600: only
// that user (root) may connect.
var DefaultSocketPerm = SocketPerm{UID: -1, GID: -1, Mode: 0o600}

// ParseSocketOwner parses USER[:GROUP] (names or numbers) into a uid and a
// gid (-1 where not given).
func ParseSocketOwner(s string) (uid, gid int, err error) {
	u, g, hasG := strings.Cut(s, ":")
	uid, gid = -1, -1
	if u != "" {
		if uid, err = strconv.Atoi(u); err != nil {
			pu, lerr := user.Lookup(u)
			if lerr != nil {
				return -1, -1, fmt.Errorf("no user %q", u)
			}
			uid, _ = strconv.Atoi(pu.Uid)
		}
	}
	if hasG && g != "" {
		if gid, err = strconv.Atoi(g); err != nil {
			pg, lerr := user.LookupGroup(g)
			if lerr != nil {
				return -1, -1, fmt.Errorf("no group %q", g)
			}
			gid, _ = strconv.Atoi(pg.Gid)
		}
	}
	if s == "" || (u == "" && gid == -1) {
		return -1, -1, errors.New("want USER[:GROUP]")
	}
	return uid, gid, nil
}

// SocketDir is the default directory of a gateway's per-VM sockets.
func SocketDir(cluster, host string) string {
	return filepath.Join("/run/sluice", "gw-"+cluster+"-"+host)
}

// VMSocket is the path of VM vm's socket in a gateway's socket directory:
// its disks are nbd+unix:///VM/DISK?socket=VMSocket(dir, VM).
func VMSocket(dir, vm string) string { return filepath.Join(dir, vm+".sock") }

// maxSocketPath is the longest Unix socket path (sun_path holds 108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// Listen opens the listener a gateway serves on. addr is "HOST:PORT"
// (TCP) or "unix:PATH" (a Unix socket, for VMs on the same host: no TCP/IP
// stack on the VM→gateway leg; fio reaches it as
// nbd+unix:///EXPORT?socket=PATH). A Unix socket gets DefaultSocketPerm.
// For a Unix socket the directory is created if missing, and a socket file
// left behind by a gateway that died (nobody accepts on it) is replaced; a
// socket somebody listens on, or a file that is not a socket, is an error.
// The socket file is removed when the listener closes.
func Listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix:")
	if !isUnix {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, unwrapOp(err))
		}
		return l, nil
	}
	if path == "" {
		return nil, errors.New("listen unix:: want unix:PATH")
	}
	return listenUnix(path, DefaultSocketPerm)
}

// listenUnix opens a Unix socket at path that only perm's owner/group/mode
// may connect to, from its first instant: it is bound in a private
// directory (mode 0700) beside path, given its owner and mode, then renamed
// to path.
func listenUnix(path string, perm SocketPerm) (net.Listener, error) {
	addr := "unix:" + path
	dir := filepath.Dir(path)
	tmpDir := filepath.Join(dir, ".t")
	tmp := filepath.Join(tmpDir, filepath.Base(path))
	if len(tmp) > maxSocketPath {
		return nil, fmt.Errorf("listen %s: path too long for a Unix socket (%d bytes, at most %d here)", addr, len(path), maxSocketPath-(len(tmp)-len(path)))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := replaceStale(path); err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := os.Mkdir(tmpDir, 0o700); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	_ = os.Remove(tmp) // ours, from a gateway that died between bind and rename
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, unwrapOp(err))
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if perm.UID != -1 || perm.GID != -1 {
		if err := os.Lchown(tmp, perm.UID, perm.GID); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmp, perm.Mode.Perm()); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	_ = os.Remove(tmpDir) // fails while another socket is being made: fine
	return &unixListener{UnixListener: ul, path: path}, nil
}

// replaceStale removes a socket file at path that nobody accepts on; a live
// socket or a file that is not a socket is an error.
func replaceStale(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		c.Close()
		return fmt.Errorf("another server listens on %s", path)
	case errors.Is(err, syscall.ECONNREFUSED):
		_ = os.Remove(path) // stale: its server is gone
		return nil
	default:
		return unwrapOp(err)
	}
}

// unixListener is a Unix socket listener bound under another name and
// renamed to path: Addr names path, and Close removes it.
type unixListener struct {
	*net.UnixListener
	path  string
	rmDir bool // remove the socket's directory when it is left empty
	once  sync.Once
}

func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		_ = os.Remove(l.path)
		if l.rmDir {
			_ = os.Remove(filepath.Dir(l.path)) // fails while other sockets are there
		}
	})
	return err
}

// ListenVMs opens one Unix socket per VM, VMSocket(dir, vm), each with
// perm; on error none is left open.
func ListenVMs(dir string, vms []string, perm SocketPerm) (map[string]net.Listener, error) {
	ls := map[string]net.Listener{}
	for _, vm := range vms {
		l, err := listenUnix(VMSocket(dir, vm), perm)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		l.(*unixListener).rmDir = true
		ls[vm] = l
	}
	return ls, nil
}

// ServerTLSConfig is the TLS configuration of a gateway's TCP listener: its
// certificate and key, and the CA that signs its clients' certificates. A
// client must present a certificate of that CA; its Common Name is the VM
// whose disks it may open.
func ServerTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s, key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s: no PEM certificate", caFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, nil
}

// OwnDisks is the gateway's access rule: identity id (a VM name) may list
// and open the exports VM/DISK of that VM only.
func OwnDisks(id, export string) bool {
	vm, _, ok := strings.Cut(export, "/")
	return ok && id != "" && vm == id
}

// VMs lists the VMs whose disks this gateway serves.
func (g *Gateway) VMs() []string {
	seen := map[string]bool{}
	var vms []string
	for _, name := range g.exports.Names() {
		if vm, _, _ := strings.Cut(name, "/"); !seen[vm] {
			seen[vm] = true
			vms = append(vms, vm)
		}
	}
	sort.Strings(vms)
	return vms
}

// DefaultMaxConnsPerVM is Options.MaxConnsPerVM's default.
const DefaultMaxConnsPerVM = 64

// maxConnsPerVM is Options.MaxConnsPerVM or its default.
func (g *Gateway) maxConnsPerVM() int {
	if n := g.opts.MaxConnsPerVM; n > 0 {
		return n
	}
	return DefaultMaxConnsPerVM
}

// ServeVM serves VM vm's disks, and nothing else, on l (its own socket)
// until Close. At most Options.MaxConnsPerVM connections are open on it.
// The Status names a VM socket unix:DIR/*.sock.
func (g *Gateway) ServeVM(l net.Listener, vm string) error {
	n := g.maxConnsPerVM()
	name := listenName(l)
	if a := l.Addr(); a.Network() == "unix" {
		name = "unix:" + filepath.Join(filepath.Dir(a.String()), "*.sock")
	}
	return g.serveNamed(l, nbd.Access{Identity: vm, Allow: OwnDisks, MaxConns: n}, name)
}

// Bounds of the TLS listener's connections that have not authenticated
// (nbd.Access.MaxUnauthenticated, ...PerSource, AuthTimeout): strangers
// holding connections open in the handshake displace each other, not the
// VMs with certificates.
const (
	TLSMaxUnauthenticated          = 128
	TLSMaxUnauthenticatedPerSource = 16
	TLSAuthTimeout                 = 3 * time.Second
)

// ServeTLS serves on l (TCP) with TLS required: a client presents a
// certificate (cfg's ClientCAs) and opens the disks of the VM its Common
// Name names. Half of the server's connection cap is open to it, so that
// strangers in the handshake cannot take every place from the VMs' sockets.
// Of those, at most TLSMaxUnauthenticated (TLSMaxUnauthenticatedPerSource
// per remote address) may be waiting to authenticate, for at most
// TLSAuthTimeout; a newer one closes the oldest. One VM's certificate
// opens at most Options.MaxConnsPerVM connections, as on its socket.
func (g *Gateway) ServeTLS(l net.Listener, cfg *tls.Config) error {
	n := g.srv.MaxConns
	if n <= 0 {
		n = nbd.DefaultMaxConns
	}
	return g.ServeAccess(l, nbd.Access{Allow: OwnDisks, TLS: cfg, MaxConns: max(n/2, 1),
		MaxUnauthenticated: TLSMaxUnauthenticated, MaxUnauthenticatedPerSource: TLSMaxUnauthenticatedPerSource,
		AuthTimeout: TLSAuthTimeout, MaxConnsPerIdentity: g.maxConnsPerVM()})
}

// unwrapOp drops net.OpError's repetition of the operation and address
// (the caller's message names them).
func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

// listenName is how a listener's address appears in the Status: the form
// Listen accepts ("unix:PATH" or "HOST:PORT").
func listenName(l net.Listener) string {
	if a := l.Addr(); a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return l.Addr().String()
}
