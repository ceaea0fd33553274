package virt

import (
	"context"
	"errors"
	"fmt"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
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

// ErrNotRunning is returned by Conn.LiveXML for a domain that does not run.
var ErrNotRunning = errors.New("domain is not running")

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

// LiveXML returns the domain's live XML.
func (c *Libvirt) LiveXML(name string) ([]byte, error) {
	d, err := c.l.DomainLookupByName(name)
	if err != nil {
		if libvirt.IsNotFound(err) {
			return nil, fmt.Errorf("DomainLookupByName %s: %w", name, ErrNotRunning)
		}
		return nil, fmt.Errorf("DomainLookupByName %s: %w", name, err)
	}
	state, _, err := c.l.DomainGetState(d, 0)
	if err != nil {
		return nil, fmt.Errorf("DomainGetState %s: %w", name, err)
	}
	if s := libvirt.DomainState(state); s == libvirt.DomainShutoff || s == libvirt.DomainCrashed || s == libvirt.DomainNostate {
		return nil, fmt.Errorf("domain %s: %w", name, ErrNotRunning)
	}
	x, err := c.l.DomainGetXMLDesc(d, 0)
	if err != nil {
		if libvirt.IsNotFound(err) {
			return nil, fmt.Errorf("DomainGetXMLDesc %s: %w", name, ErrNotRunning)
		}
		return nil, fmt.Errorf("DomainGetXMLDesc %s: %w", name, err)
	}
	return []byte(x), nil
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
