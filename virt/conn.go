package virt

import (
	"context"
	"errors"
	"fmt"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"sluice/agent"
)

// DefaultSocket is libvirtd's read-write Unix socket (qemu:///system).
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// Conn is the part of libvirt the inventory uses: list the running domains,
// read a running domain's live XML, and follow lifecycle events. Libvirt
// implements it; tests use a fake.
type Conn interface {
	// Running returns the names of the running (active) domains.
	Running() ([]string, error)
	// LiveXML returns the live XML of the named domain; an error that
	// matches ErrNotRunning when it does not run (any more).
	LiveXML(name string) ([]byte, error)
	// Lifecycle streams the domains' lifecycle events until ctx ends or
	// the connection is lost; then the channel is closed.
	Lifecycle(ctx context.Context) (<-chan Event, error)
}

// ErrNotRunning is returned by Conn.LiveXML for a domain that does not run
// (the agent's own sentinel: a Pinner returns it too).
var ErrNotRunning = agent.ErrDomainNotRunning

// EventKind is what a lifecycle event means to the inventory.
type EventKind int

// The lifecycle events the inventory acts on; EventOther is re-read like a
// start when the domain still runs.
const (
	EventOther EventKind = iota
	EventStarted
	EventStopped
	EventMigratedIn  // started as the target of a migration
	EventMigratedOut // stopped because it migrated away
)

func (k EventKind) String() string {
	return [...]string{"other", "started", "stopped", "migrated-in", "migrated-out"}[k]
}

// Event is one domain lifecycle event.
type Event struct {
	Domain string
	Kind   EventKind
}

// Lifecycle event and detail codes of libvirt (virDomainEventType).
func kindOf(event, detail int32) EventKind {
	switch libvirt.DomainEventType(event) {
	case libvirt.DomainEventStarted:
		if libvirt.DomainEventStartedDetailType(detail) == libvirt.DomainEventStartedMigrated {
			return EventMigratedIn
		}
		return EventStarted
	case libvirt.DomainEventStopped:
		if libvirt.DomainEventStoppedDetailType(detail) == libvirt.DomainEventStoppedMigrated {
			return EventMigratedOut
		}
		return EventStopped
	case libvirt.DomainEventCrashed, libvirt.DomainEventUndefined:
		return EventStopped
	}
	return EventOther // defined, suspended, resumed, shutdown begun, pmsuspended
}

// Libvirt is a Conn to libvirtd over its Unix socket, through
// github.com/digitalocean/go-libvirt (pure Go, libvirt's RPC protocol).
type Libvirt struct {
	l *libvirt.Libvirt
}

var _ Conn = (*Libvirt)(nil)

// Dial connects to libvirtd's socket (DefaultSocket when empty) as
// qemu:///system.
func Dial(socket string) (*Libvirt, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, fmt.Errorf("libvirt connect %s: %w", socket, err)
	}
	return &Libvirt{l: l}, nil
}

// Close disconnects.
func (c *Libvirt) Close() error { return c.l.Disconnect() }

// Disconnected is closed when the connection to libvirtd is lost.
func (c *Libvirt) Disconnected() <-chan struct{} { return c.l.Disconnected() }

// Client returns the underlying go-libvirt client (for tests that start
// and destroy domains).
func (c *Libvirt) Client() *libvirt.Libvirt { return c.l }

// Running lists the active domains.
func (c *Libvirt) Running() ([]string, error) {
	doms, _, err := c.l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	if err != nil {
		return nil, fmt.Errorf("ConnectListAllDomains: %w", err)
	}
	names := make([]string, len(doms))
	for i, d := range doms {
		names[i] = d.Name
	}
	return names, nil
}

// runningDomain looks up the running domain name. A domain may go away
// between any two calls (destroyed behind sluice's back): that, a domain
// not found and one shut off are ErrNotRunning.
func runningDomain(l *libvirt.Libvirt, name string) (libvirt.Domain, error) {
	d, err := l.DomainLookupByName(name)
	if err != nil {
		return d, fmt.Errorf("DomainLookupByName %s: %w", name, notRunning(err))
	}
	state, _, err := l.DomainGetState(d, 0)
	if err != nil {
		return d, fmt.Errorf("DomainGetState %s: %w", name, notRunning(err))
	}
	if s := libvirt.DomainState(state); s == libvirt.DomainShutoff || s == libvirt.DomainCrashed || s == libvirt.DomainNostate {
		return d, fmt.Errorf("domain %s: %w", name, ErrNotRunning)
	}
	return d, nil
}

// LiveXML returns the domain's live XML.
func (c *Libvirt) LiveXML(name string) ([]byte, error) {
	d, err := runningDomain(c.l, name)
	if err != nil {
		return nil, err
	}
	x, err := c.l.DomainGetXMLDesc(d, 0)
	if err != nil {
		return nil, fmt.Errorf("DomainGetXMLDesc %s: %w", name, notRunning(err))
	}
	return []byte(x), nil
}

// notRunning maps libvirt's "no domain" and "not running" errors to
// ErrNotRunning (the domain went away between two calls).
func notRunning(err error) error {
	if libvirt.IsNotFound(err) || libvirt.IsNotFound(errors.Unwrap(err)) {
		return fmt.Errorf("%w (%v)", ErrNotRunning, err)
	}
	var le libvirt.Error
	if errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrOperationInvalid {
		return fmt.Errorf("%w (%v)", ErrNotRunning, err)
	}
	return err
}

// Lifecycle subscribes to the lifecycle events of every domain.
func (c *Libvirt) Lifecycle(ctx context.Context) (<-chan Event, error) {
	in, err := c.l.LifecycleEvents(ctx)
	if err != nil {
		return nil, fmt.Errorf("LifecycleEvents: %w", err)
	}
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		for m := range in {
			select {
			case out <- Event{Domain: m.Dom.Name, Kind: kindOf(m.Event, m.Detail)}:
			case <-ctx.Done():
				for range in { // let go-libvirt's goroutine finish
				}
				return
			}
		}
	}()
	return out, nil
}
