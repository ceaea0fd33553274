package controller

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// probeEnv makes the test binary an etcd client that puts a key at the
// endpoint and exits (0: written); TestEtcdPrivate runs it as another
// user.
const probeEnv = "SLUICE_TEST_ETCD_PROBE"

// etcdProbe is the test binary run with probeEnv=ENDPOINT KEY.
func etcdProbe(spec string) int {
	ep, key, _ := strings.Cut(spec, " ")
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: quietLogger()})
	if err != nil {
		fmt.Println("refused:", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, "written by uid "+fmt.Sprint(os.Getuid())); err != nil {
		fmt.Println("refused:", err)
		return 1
	}
	fmt.Println("written")
	return 0
}

// TestEtcdPrivate: the embedded member listens on a Unix socket in its
// directory (made 0700 even if it was not) and on nothing else; a real
// etcd client of another user cannot write through it, while the same
// client run as the controller's user can.
func TestEtcdPrivate(t *testing.T) {
	base := t.TempDir()
	// Everything above the member's directory is open to all: only its
	// own mode protects it.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "etcd")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := OpenEtcd(EtcdConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("member directory: %v %v, want mode 0700", fi.Mode(), err)
	}
	if len(e.Embedded.Peers) != 0 {
		t.Errorf("%d peer listeners, want none", len(e.Embedded.Peers))
	}
	for _, l := range e.Embedded.Clients {
		if l.Addr().Network() != "unix" || l.Addr().String() != filepath.Join(dir, EtcdSocket) {
			t.Errorf("client listener %s %s, want only the Unix socket", l.Addr().Network(), l.Addr())
		}
	}
	ep := "unix://" + filepath.Join(dir, EtcdSocket)
	probe := func(key string, cred *syscall.Credential) (string, error) {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			// The other user needs to run a copy of the test binary.
			bin := t.TempDir()
			if err := os.Chmod(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			exe = copyFile(t, exe, filepath.Join(bin, "probe"))
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), probeEnv+"="+ep+" "+key)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	// The controller's user writes through the socket (root also would,
	// as root can read the data directory).
	if out, err := probe("/probe/own", nil); err != nil || out != "written" {
		t.Fatalf("the controller's user through %s: %v %s", ep, err, out)
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot run the client as another user")
	}
	out, err := probe("/sluice/desired/h1", &syscall.Credential{Uid: 65534, Gid: 65534})
	if err == nil || !strings.HasPrefix(out, "refused:") {
		t.Errorf("uid 65534 through %s: %v %s, want refused", ep, err, out)
	}
	t.Logf("uid 65534: %s", out)
	resp, err := e.Client.Get(context.Background(), "/sluice/desired/h1")
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the other user's key: %v %v, want absent", resp.Kvs, err)
	}
}

func copyFile(t *testing.T, from, to string) string {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return to
}

// TestEtcdUpgradeFromTCP: a member made by an earlier controller, whose
// client and peer endpoints were TCP ports on 127.0.0.1, starts on its
// Unix socket with its data.
func TestEtcdUpgradeFromTCP(t *testing.T) {
	dir := t.TempDir()
	ec := embed.NewConfig()
	ec.Name = "sluice"
	ec.Dir = filepath.Join(dir, "member-data")
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel, ec.LogOutputs, ec.UnsafeNoFsync = "error", []string{filepath.Join(dir, "etcd.log")}, true
	old, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	<-old.Server.ReadyNotify()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(context.Background(), "/sluice/state/seq", "41"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	old.Close()
	e, err := OpenEtcd(EtcdConfig{Dir: dir, UnsafeNoFsync: true, StartTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	resp, err := e.Client.Get(context.Background(), "/sluice/state/seq")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "41" {
		t.Fatalf("after the upgrade: %v %v", resp, err)
	}
	if _, err := e.Client.Put(context.Background(), "/sluice/state/seq", "42"); err != nil {
		t.Fatalf("a write after the upgrade: %v", err)
	}
}

// TestEtcdExternalTLS: an external member that requires client
// certificates refuses a controller without one and serves one with the
// certificate of --etcd-cert, --etcd-key and --etcd-ca.
func TestEtcdExternalTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, dir, "ca", nil, nil)
	newCert(t, dir, "server", ca, caKey)
	newCert(t, dir, "client", ca, caKey)
	other, otherKey := newCert(t, dir, "other-ca", nil, nil)
	newCert(t, dir, "stranger", other, otherKey)
	f := func(name string) string { return filepath.Join(dir, name) }
	ec := embed.NewConfig()
	ec.Name = "ext"
	ec.Dir = filepath.Join(dir, "member-data")
	cu := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile = f("server.pem"), f("server-key.pem")
	ec.ClientTLSInfo.TrustedCAFile, ec.ClientTLSInfo.ClientCertAuth = f("ca.pem"), true
	ec.LogLevel, ec.LogOutputs, ec.UnsafeNoFsync = "error", []string{filepath.Join(dir, "etcd.log")}, true
	ext, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	<-ext.Server.ReadyNotify()
	eps := []string{cu.String()}
	for _, cfg := range []EtcdConfig{
		{Endpoints: eps, CAFile: f("ca.pem")},                                                              // no client certificate
		{Endpoints: eps, CertFile: f("client.pem"), KeyFile: f("client-key.pem")},                          // the server not trusted
		{Endpoints: eps, CertFile: f("stranger.pem"), KeyFile: f("stranger-key.pem"), CAFile: f("ca.pem")}, // signed by another CA
		{Endpoints: eps, CertFile: f("client.pem"), CAFile: f("ca.pem")},                                   // no key
	} {
		cfg.StartTimeout = 2 * time.Second
		if e, err := OpenEtcd(cfg); err == nil {
			e.Close()
			t.Errorf("%+v: connected, want refused", cfg)
		}
	}
	e, err := OpenEtcd(EtcdConfig{Endpoints: eps, CertFile: f("client.pem"), KeyFile: f("client-key.pem"), CAFile: f("ca.pem"), StartTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Client.Put(context.Background(), "/sluice/state/seq", "1"); err != nil {
		t.Fatal(err)
	}
}

// newCert writes NAME.pem and NAME-key.pem into dir: a CA (parent nil),
// else a certificate for 127.0.0.1 signed by parent, for servers and
// clients.
func newCert(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}
