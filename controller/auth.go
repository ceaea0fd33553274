package controller

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// Files the controller writes into its data directory at first start.
const (
	TokenFile = "token"        // the generated bearer token, mode 0600
	CertFile  = "tls/cert.pem" // the generated self-signed certificate
	KeyFile   = "tls/key.pem"  // its ECDSA key, mode 0600
)

// Tokens is the set of bearer tokens the API accepts, each with the
// identity it acts as. Only their SHA-256 digests are kept; a check
// compares against every one in constant time. Replace swaps the set
// while the API serves.
type Tokens struct {
	set atomic.Pointer[tokenSet]
}

type tokenSet struct {
	digests [][sha256.Size]byte
	hosts   []string // the host each token acts as; "" for an operator
	flows   []string // each token's flow (Identity.Flow)
}

// Replace makes n's tokens the tokens of t (a reload of the tokens
// file): requests checked from then on see them.
func (t *Tokens) Replace(n *Tokens) { t.set.Store(n.set.Load()) }

// Len returns how many tokens t holds, and how many of them are hosts'.
func (t *Tokens) Len() (all, hosts int) {
	s := t.set.Load()
	for _, h := range s.hosts {
		if h != "" {
			hosts++
		}
	}
	return len(s.digests), hosts
}

// Identity is who a token acts as: an operator (Host empty: every route)
// or the agent of one host (only that host's routes).
type Identity struct {
	Host string
	// Flow is the queue the token's requests wait in for a seat of
	// the API (fairness.go): "host NAME" for a host's token (a host's
	// tokens share it), "operator N" for the Nth operator token of the
	// tokens file. It never holds the token or its digest, so that it
	// can be logged.
	Flow string
}

// key names the identity for the limits on requests in flight.
func (id Identity) key() string { return "host " + id.Host }

// ParseTokens reads tokens one per line; blank lines and lines starting
// with # are ignored. A token has at least 16 characters and no spaces;
// it may be followed by host=NAME: it then acts as the agent of host NAME
// only (node authorization); without it, as an operator.
func ParseTokens(data []byte) (*Tokens, error) {
	t := &tokenSet{}
	seen := map[[sha256.Size]byte]bool{}
	operators := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		tok, host := fields[0], ""
		if len(tok) < 16 {
			return nil, fmt.Errorf("line %d: a token has at least 16 characters and no spaces", n)
		}
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			switch {
			case k != "host":
				return nil, fmt.Errorf("line %d: %q: after the token only host=NAME", n, f)
			case host != "":
				return nil, fmt.Errorf("line %d: host given twice", n)
			case v == "" || strings.ContainsAny(v, "/?#%"):
				return nil, fmt.Errorf("line %d: host=%q: want a host name of the policy", n, v)
			}
			host = v
		}
		d := sha256.Sum256([]byte(tok))
		if seen[d] {
			return nil, fmt.Errorf("line %d: the token is given twice", n)
		}
		seen[d] = true
		t.digests = append(t.digests, d)
		t.hosts = append(t.hosts, host)
		if host != "" {
			t.flows = append(t.flows, Identity{Host: host}.key())
		} else {
			operators++
			t.flows = append(t.flows, fmt.Sprintf("operator %d", operators))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.digests) == 0 {
		return nil, errors.New("no token")
	}
	toks := &Tokens{}
	toks.set.Store(t)
	return toks, nil
}

// Valid reports whether tok is one of the tokens. Its time does not depend
// on which token matches or on how much of one does.
func (t *Tokens) Valid(tok string) bool {
	_, ok := t.Lookup(tok)
	return ok
}

// Lookup returns the identity of tok and whether it is one of the tokens,
// in a time that does not depend on which token matches.
func (t *Tokens) Lookup(tok string) (Identity, bool) {
	s := t.set.Load()
	d := sha256.Sum256([]byte(tok))
	match := -1
	for i := range s.digests {
		match = subtle.ConstantTimeSelect(subtle.ConstantTimeCompare(d[:], s.digests[i][:]), i, match)
	}
	if match < 0 || tok == "" {
		return Identity{}, false
	}
	return Identity{Host: s.hosts[match], Flow: s.flows[match]}, true
}

// NewHostToken returns a line of a tokens file with a new token (32
// random bytes, hex) for the agent of host only.
func NewHostToken(host string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	line := hex.EncodeToString(b) + " host=" + host
	if _, err := ParseTokens([]byte(line)); err != nil {
		return "", errors.New(strings.TrimPrefix(err.Error(), "line 1: "))
	}
	return line, nil
}

// LoadTokens reads the tokens of path; path "" means the token of the data
// directory, generated (32 random bytes, hex, mode 0600) when absent.
func LoadTokens(path, dataDir string) (*Tokens, error) {
	if path == "" {
		path = filepath.Join(dataDir, TokenFile)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				return nil, err
			}
			if err := writeNew(path, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
				return nil, err
			}
		}
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: mode %04o: a tokens file must not be readable by others (chmod 600 %s)", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return t, nil
}

// EnsureCert returns the paths of the certificate and key to serve: those
// given, else the ones in the data directory, generated at first start (a
// self-signed ECDSA P-256 certificate for 127.0.0.1, ::1 and localhost,
// valid ten years).
func EnsureCert(certPath, keyPath, dataDir string) (string, string, error) {
	if certPath != "" || keyPath != "" {
		if certPath == "" || keyPath == "" {
			return "", "", errors.New("--tls-cert and --tls-key go together")
		}
		return certPath, keyPath, nil
	}
	certPath, keyPath = filepath.Join(dataDir, CertFile), filepath.Join(dataDir, KeyFile)
	if _, err := os.Stat(certPath); err == nil {
		return certPath, keyPath, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sluice controller"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return "", "", err
	}
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writeNew writes a file through a temporary name and a rename, so that a
// crash never leaves half a key or token.
func writeNew(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
