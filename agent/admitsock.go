package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"sluice/admit"
	"sluice/policy"
)

// Admission at VM start has one source of truth on a host: its agent. The
// libvirt hook (`sluice hook qemu`) asks the agent over a Unix socket,
// mode 0600 (root only), whether a domain may start. An agent that follows
// a controller asks it (Ask): the controller decides with the whole
// cluster (every host's VMs, the pool and datastore quotas) and holds the
// reservations of the VM it admits while it starts. A domain the
// controller does not know (the policy does not name it), an agent with a
// policy file, and an agent whose controller does not answer decide here:
// with the policy the agent enforces (its file, or its host's part of the
// controller's), the domains that run on the host now and the VMs the
// controller has started or moved here that do not run yet (they hold
// their reservations: DesiredHost.Starting).

// AdmitSocket is the path of host's admission socket under stateDir.
func AdmitSocket(stateDir, host string) string {
	return filepath.Join(stateDir, "agent-"+host+".sock")
}

// Admitter answers admission questions for one host.
type Admitter struct {
	Host string
	// Running returns the domains that run on the host now (with their
	// vNIC counts, for the ones the policy does not name).
	Running func() ([]admit.Domain, error)
	// Ask, when set, asks the controller whether dom may start on Host:
	// known is false when the controller does not know the VM; err when
	// it could not be asked. Then the agent decides itself.
	Ask func(ctx context.Context, dom admit.Domain) (d admit.Decision, known bool, err error)

	mu       sync.Mutex
	p        *policy.Policy
	starting []string
	measured func() map[string]float64
}

// SetMeasured makes f the source of the datastores' capacities the host
// measured (Throttler.Measured): a datastore whose policy declares no
// capacity is bounded by it when this host decides (policy.Datastore.
// IOPSQuota), as the controller does with its hosts' reports.
func (a *Admitter) SetMeasured(f func() map[string]float64) {
	a.mu.Lock()
	a.measured = f
	a.mu.Unlock()
}

// Set gives the admitter the policy in force and the VMs that hold
// reservations on the host before they run (starting or moving in).
func (a *Admitter) Set(p *policy.Policy, starting []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.p, a.starting = p, slices.Clone(starting)
}

// Decide is the answer for dom: admit.Decide with the domains that run
// and those that hold reservations while starting.
func (a *Admitter) Decide(ctx context.Context, dom admit.Domain) (admit.Decision, error) {
	note := ""
	if a.Ask != nil {
		actx, cancel := context.WithTimeout(ctx, askTimeout)
		d, known, err := a.Ask(actx, dom)
		cancel()
		switch {
		case err == nil && known:
			return d, nil
		case err != nil:
			note = fmt.Sprintf(" (decided by this host without the controller, which did not answer: %v; the pool and datastore quotas of the cluster were not checked)", err)
		}
	}
	a.mu.Lock()
	p, starting, measured := a.p, a.starting, a.measured
	a.mu.Unlock()
	if p == nil {
		return admit.Decision{}, errors.New("the agent has no policy yet")
	}
	if measured != nil {
		p = p.WithMeasuredIOPS(measured())
	}
	running, err := a.Running()
	if err != nil {
		return admit.Decision{}, fmt.Errorf("the domains that run: %w", err)
	}
	for _, vm := range starting {
		if !slices.ContainsFunc(running, func(d admit.Domain) bool { return admit.VMName(p, d) == vm }) {
			running = append(running, admit.Domain{Name: vm})
		}
	}
	d := admit.Decide(p, a.Host, dom, running)
	d.Why += note
	return d, nil
}

// askTimeout bounds Ask: the hook waits for the answer.
const askTimeout = 3 * time.Second

// admitRequest is the body of POST /v1/admit.
type admitRequest struct {
	Name  string `json:"name"`
	UUID  string `json:"uuid,omitempty"`
	VNICs int    `json:"vnics"`
}

// admitAnswer is its answer.
type admitAnswer struct {
	Allow   bool     `json:"allow"`
	VM      string   `json:"vm,omitempty"`
	Why     string   `json:"why"`
	Details []string `json:"details,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// ServeAdmit answers on the Unix socket path (mode 0600, replacing a
// stale socket) until ctx ends.
func (a *Admitter) ServeAdmit(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	_ = os.Remove(path) // a socket left by a killed agent
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("admission socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("admission socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/admit", func(w http.ResponseWriter, r *http.Request) {
		var req admitRequest
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil || req.Name == "" {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(admitAnswer{Error: "want {name, uuid, vnics}"})
			return
		}
		d, err := a.Decide(r.Context(), admit.Domain{Name: req.Name, UUID: req.UUID, VNICs: req.VNICs})
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(admitAnswer{Error: err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(admitAnswer{Allow: d.Allow, VM: d.VM, Why: d.Why, Details: d.Details})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	_ = os.Remove(path)
	return err
}

// AskAdmit asks the agent on the socket path whether dom may start.
func AskAdmit(ctx context.Context, path string, dom admit.Domain) (admit.Decision, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
	body, _ := json.Marshal(admitRequest{Name: dom.Name, UUID: dom.UUID, VNICs: dom.VNICs})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/v1/admit", bytes.NewReader(body))
	if err != nil {
		return admit.Decision{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return admit.Decision{}, err
	}
	defer resp.Body.Close()
	var ans admitAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ans); err != nil {
		return admit.Decision{}, fmt.Errorf("the agent's answer: %v", err)
	}
	if ans.Error != "" {
		return admit.Decision{}, errors.New(ans.Error)
	}
	return admit.Decision{Allow: ans.Allow, VM: ans.VM, Why: ans.Why, Details: ans.Details}, nil
}
