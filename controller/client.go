package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Client speaks the controller's API: `sluice ctl` uses it, and so will
// the agents (Register, Heartbeat, Report, WatchDesired).
type Client struct {
	// Server is the base URL, https://HOST:PORT.
	Server string
	// Token is the bearer token.
	Token string
	// HTTP is the client; NewClient sets one that trusts the CA given.
	HTTP *http.Client
}

// NewClient returns a client of server (https://HOST:PORT: the token goes
// over TLS only) that authenticates with token and trusts the PEM
// certificates in caFile ("" : the system's roots).
func NewClient(server, token, caFile string) (*Client, error) {
	if !strings.HasPrefix(strings.ToLower(server), "https://") {
		return nil, fmt.Errorf("controller %q: not https://: sluice sends its token only over TLS", server)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	return &Client{Server: strings.TrimRight(server, "/"), Token: token,
		HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: nil, ForceAttemptHTTP2: true}}}, nil
}

// ReadToken reads the first token of a token file (a line of a tokens
// file: what follows the token, such as host=h1, is left out).
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return strings.Fields(l)[0], nil
		}
	}
	return "", fmt.Errorf("%s: no token", path)
}

// do sends a request with body in (nil: none) and decodes the answer into
// out. An answer other than 200 is an *Error with the server's body.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(b, &e.Body) != nil || e.Body.Error == "" {
			e.Body.Error = fmt.Sprintf("%s %s: %s", method, path, resp.Status)
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: answer: %w", method, path, err)
	}
	return nil
}

// StatusOf returns the HTTP status of an *Error, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Apply applies a policy document.
func (c *Client) Apply(ctx context.Context, req ApplyRequest) (Result, error) {
	var r Result
	return r, c.do(ctx, "POST", "/v1/policy", req, &r)
}

// Policy returns the stored policy.
func (c *Client) Policy(ctx context.Context) (PolicyState, error) {
	var p PolicyState
	return p, c.do(ctx, "GET", "/v1/policy", nil, &p)
}

// Hosts lists the hosts.
func (c *Client) Hosts(ctx context.Context) ([]HostInfo, error) {
	var hs []HostInfo
	return hs, c.do(ctx, "GET", "/v1/hosts", nil, &hs)
}

// VMs lists the VMs.
func (c *Client) VMs(ctx context.Context) ([]VMInfo, error) {
	var vs []VMInfo
	return vs, c.do(ctx, "GET", "/v1/vms", nil, &vs)
}

// Events lists the events numbered after after.
func (c *Client) Events(ctx context.Context, after int64) ([]Event, error) {
	var es []Event
	return es, c.do(ctx, "GET", fmt.Sprintf("/v1/events?after=%d", after), nil, &es)
}

// Decisions lists the recorded migrations.
func (c *Client) Decisions(ctx context.Context) ([]Decision, error) {
	var ds []Decision
	return ds, c.do(ctx, "GET", "/v1/decisions", nil, &ds)
}

// Set makes changes (TARGET.FIELD=VALUE), all or none.
func (c *Client) Set(ctx context.Context, req SetRequest) (Result, error) {
	var r Result
	return r, c.do(ctx, "POST", "/v1/set", req, &r)
}

// Explain explains a port or disk.
func (c *Client) Explain(ctx context.Context, port string) (Explanation, error) {
	var e Explanation
	return e, c.do(ctx, "GET", "/v1/explain?port="+url.QueryEscape(port), nil, &e)
}

// WhatIf asks what a set of changes would give, without making them.
func (c *Client) WhatIf(ctx context.Context, req SetRequest) (WhatIfResult, error) {
	var r WhatIfResult
	return r, c.do(ctx, "POST", "/v1/what-if", req, &r)
}

// History returns the rate history of port ("": every port).
func (c *Client) History(ctx context.Context, port string) (History, error) {
	var h History
	return h, c.do(ctx, "GET", "/v1/history?port="+url.QueryEscape(port), nil, &h)
}

// PowerOn powers a VM on.
func (c *Client) PowerOn(ctx context.Context, vm string, req PowerOnRequest) (Result, error) {
	var r Result
	return r, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(vm)+"/power-on", req, &r)
}

// Admit asks whether a domain may start on req.Host (the agents ask, for
// their libvirt hook).
func (c *Client) Admit(ctx context.Context, vm string, req AdmitRequest) (AdmitAnswer, error) {
	var a AdmitAnswer
	return a, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(vm)+"/admit", req, &a)
}

// Migrate moves a VM (the agents carry it out).
func (c *Client) Migrate(ctx context.Context, vm string, req MigrateRequest) (Result, error) {
	var r Result
	return r, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(vm)+"/migrate", req, &r)
}

// Approve carries out a recommended decision.
func (c *Client) Approve(ctx context.Context, seq int64, reason string) (Result, error) {
	var r Result
	return r, c.do(ctx, "POST", fmt.Sprintf("/v1/decisions/%d/approve", seq), ApproveRequest{Reason: reason}, &r)
}

// Register registers host with its first report and returns its lease.
func (c *Client) Register(ctx context.Context, host string, r Report) (Lease, error) {
	var l Lease
	return l, c.do(ctx, "POST", "/v1/hosts/"+url.PathEscape(host)+"/register", RegisterRequest{Report: r}, &l)
}

// Heartbeat renews a lease; a 404 (StatusOf) means: register again.
func (c *Client) Heartbeat(ctx context.Context, host string, lease int64) error {
	return c.do(ctx, "POST", "/v1/hosts/"+url.PathEscape(host)+"/heartbeat", HeartbeatRequest{LeaseID: lease}, nil)
}

// Report replaces host's report and renews its lease.
func (c *Client) Report(ctx context.Context, host string, lease int64, r Report) error {
	return c.do(ctx, "POST", "/v1/hosts/"+url.PathEscape(host)+"/report", ReportRequest{LeaseID: lease, Report: r}, nil)
}

// WatchDesired returns host's desired state once its revision is larger
// than after, or after wait with the revision unchanged.
func (c *Client) WatchDesired(ctx context.Context, host string, after int64, wait time.Duration) (DesiredHost, error) {
	var d DesiredHost
	return d, c.do(ctx, "GET", fmt.Sprintf("/v1/hosts/%s/desired?after=%d&wait=%s", url.PathEscape(host), after, wait), nil, &d)
}
