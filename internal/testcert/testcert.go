// Package testcert makes a throw-away certificate authority with a server
// certificate and client certificates for tests of TLS servers. Keys are
// ECDSA P-256; certificates are valid for a day.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// Pair is a certificate and its key, in PEM.
type Pair struct{ CertPEM, KeyPEM []byte }

// TLS is the pair as a tls.Certificate.
func (p Pair) TLS() tls.Certificate {
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		panic(err) // made by this package: cannot fail
	}
	return c
}

var serial int64

func template(cn string) *x509.Certificate {
	serial++
	return &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// NewCA makes a certificate authority named cn.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	t := template(cn)
	t.IsCA, t.BasicConstraintsValid = true, true
	t.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, t, t, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// Server issues a server certificate for localhost, 127.0.0.1 and ::1.
func (ca *CA) Server() (Pair, error) {
	t := template("localhost")
	t.DNSNames = []string{"localhost"}
	t.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return ca.issue(t)
}

// Client issues a client certificate with Common Name cn.
func (ca *CA) Client(cn string) (Pair, error) {
	t := template(cn)
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t)
}

func (ca *CA) issue(t *x509.Certificate) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	t.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, t, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}, nil
}

// Pool is a certificate pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteDir writes, in the layout of a GnuTLS/QEMU/libnbd x509 credentials
// directory, ca-cert.pem and PREFIX-cert.pem and PREFIX-key.pem for prefix
// "server" or "client".
func (ca *CA) WriteDir(dir, prefix string, p Pair) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"ca-cert.pem": ca.CertPEM, prefix + "-cert.pem": p.CertPEM, prefix + "-key.pem": p.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
