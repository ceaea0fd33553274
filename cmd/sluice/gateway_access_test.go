package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestGatewayListenUsage: TCP without TLS, TLS without TCP, a bad socket
// mode or owner and caps below 1 are one line and exit 2, before the policy
// is read or anything listens.
func TestGatewayListenUsage(t *testing.T) {
	base := []string{"gateway", "--host", "h1", "--policy", "/nonexistent.yaml"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "127.0.0.1:10809"}, "sluice gateway: --listen 127.0.0.1:10809: TCP is served only with TLS: give --tls-cert, --tls-key and --tls-ca"},
		{[]string{"--listen", ":10809", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, "TCP is served only with TLS"},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"}, "need a --listen ADDR:PORT"},
		{[]string{"--socket-mode", "rw"}, `--socket-mode "rw": want an octal mode`},
		{[]string{"--socket-mode", "01777"}, `--socket-mode "01777": want an octal mode`},
		{[]string{"--socket-owner", "no-such-user-sluice"}, `--socket-owner "no-such-user-sluice": no user`},
		{[]string{"--socket-owner", "root:no-such-group-sluice"}, `no group "no-such-group-sluice"`},
		{[]string{"--max-conns", "0"}, "--max-conns and --max-conns-per-vm must be ≥ 1"},
	} {
		var stdout, stderr bytes.Buffer
		args := append(append([]string{}, base...), c.args...)
		code := run(args, &stdout, &stderr)
		if code != exitUsage || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("sluice %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stderr.String(), c.want)
		}
	}
}
