package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"time"

	"sluice/admit"
	"sluice/agent"
	"sluice/controller"
	"sluice/hostside"
	"sluice/internal/clock"
	"sluice/lab"
	"sluice/policy"
)

// controllerFlags connect an agent to the controller (sluice agent
// --controller URL --token-file F --ca F) instead of a policy file.
type controllerFlags struct {
	server, tokenFile, ca string
	mig                   migrateFlags // a libvirt host's executor of migrations
}

func (f *controllerFlags) register(fs *flag.FlagSet) {
	f.registerClient(fs, "the controller's URL (https://HOST:PORT): follow its policy and desired state instead of --policy")
	f.mig.register(fs)
}

// registerClient registers the flags that reach the controller (--controller
// with usage url, --token-file, --ca).
func (f *controllerFlags) registerClient(fs *flag.FlagSet, url string) {
	fs.StringVar(&f.server, "controller", "", url)
	fs.StringVar(&f.tokenFile, "token-file", "", "bearer token for the controller")
	fs.StringVar(&f.ca, "ca", "", "the controller's certificate (PEM)")
}

func (f *controllerFlags) client() (*controller.Client, error) {
	if f.tokenFile == "" {
		return nil, errors.New("--controller needs --token-file")
	}
	tok, err := controller.ReadToken(f.tokenFile)
	if err != nil {
		return nil, err
	}
	return controller.NewClient(f.server, tok, f.ca)
}

// startState waits for host's desired state, which holds the host's
// part of the policy: the controller publishes it once a policy naming
// the host is applied. Until then, and while the controller cannot be
// reached, the agent waits and says why in one line (a daemon does not
// exit because the cluster is not as planned); a refused token is an
// error.
func (f *controllerFlags) startState(ctx context.Context, cl *controller.Client, host string, logf func(format string, args ...any)) (controller.DesiredHost, error) {
	said := ""
	var wait time.Duration // the first read does not wait
	for {
		d, err := cl.WatchDesired(ctx, host, 0, wait)
		why := ""
		switch st := controller.StatusOf(err); {
		case err == nil && d.Policy != nil:
			return d, nil
		case ctx.Err() != nil:
			return controller.DesiredHost{}, ctx.Err()
		case st == http.StatusUnauthorized || st == http.StatusForbidden:
			return controller.DesiredHost{}, fmt.Errorf("controller %s: %w", f.server, err)
		case err == nil:
			why = fmt.Sprintf("the controller has published no desired state for host %s yet (no policy applied)", host)
		case st == http.StatusNotFound:
			why = fmt.Sprintf("controller %s: %v", f.server, err)
		default:
			why = fmt.Sprintf("controller %s unreachable: %v", f.server, err)
		}
		if why != said {
			logf("%s; waiting", why)
			said = why
		}
		wait = 30 * time.Second
		if err != nil && !clock.SleepCtx(ctx, time.Second) {
			return controller.DesiredHost{}, ctx.Err()
		}
	}
}

// askController is an Admitter's Ask: the controller decides whether a
// domain may start on host. A domain it does not know (404: the policy
// does not name it) is left to the agent.
func askController(cl *controller.Client, host string) func(ctx context.Context, dom admit.Domain) (admit.Decision, bool, error) {
	return func(ctx context.Context, dom admit.Domain) (admit.Decision, bool, error) {
		a, err := cl.Admit(ctx, dom.Name, controller.AdmitRequest{Host: host, UUID: dom.UUID})
		switch {
		case controller.StatusOf(err) == http.StatusNotFound:
			return admit.Decision{}, false, nil
		case err != nil:
			return admit.Decision{}, false, err
		}
		return admit.Decision{Allow: a.Allow, VM: a.VM, Why: a.Why, Details: a.Details}, true, nil
	}
}

// newAgentSide returns the host's side of the controller: a lab host gets
// a hostside.LabInventory (VMs re-plug between hosts) that replaces inv; a
// libvirt host keeps its inventory and migrates VMs in live as mig says.
// log gets the moves that failed.
func newAgentSide(src *inventoryFlags, mig *migrateFlags, pl *lab.Plan, host string, inv agent.Inventory, policies chan<- *policy.Policy, log func(error)) (*hostside.Side, agent.Inventory, error) {
	cfg := hostside.Config{Policies: policies, Log: log}
	if u, ok := inv.(interface{ Unnamed() []string }); ok {
		cfg.Unnamed = u.Unnamed
	}
	if u, ok := inv.(interface{ UUIDs() map[string]string }); ok {
		cfg.UUIDs = u.UUIDs
	}
	if src.kind != "lab" {
		cfg.VMs = func() []string { vms, _ := inv.VMs(); return vms }
		cfg.Mover = mig.mover(host, src.socket)
		return hostside.New(cfg), inv, nil
	}
	li, err := hostside.NewLabInventory(pl, host)
	if err != nil {
		return nil, nil, err
	}
	cfg.Lab = li
	cfg.Mover = func(vm string) error { return pl.Move(vm, host) }
	return hostside.New(cfg), li, nil
}
