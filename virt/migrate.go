package virt

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
)

// A live migration is carried out peer to peer: sluice asks the source's
// libvirtd to migrate the domain to DestURI, and that libvirtd connects to
// the destination's libvirtd itself (VIR_MIGRATE_PEER2PEER), so sluice
// talks to one libvirtd only and the call returns when the domain runs on
// the destination. A persistent domain moves its definition too (defined
// on the destination, undefined on the source).

// Migration says where and how a domain migrates.
type Migration struct {
	// DestURI is the destination's libvirtd as the source's libvirtd
	// reaches it (qemu+tls://HOST/system, qemu+ssh://HOST/system,
	// qemu+unix:///system?socket=PATH for a second libvirtd of the same
	// machine). Required.
	DestURI string
	// DestXML, when set, is the domain's XML on the destination: the
	// same guest (libvirt checks its ABI), e.g. with its vNICs on the
	// destination's bridges. Empty: the source's XML.
	DestXML string
	// MigrateURI, when set, is where the source's QEMU sends the guest's
	// memory (VIR_MIGRATE_PARAM_URI: tcp://HOST:PORT, or unix:///PATH
	// when both QEMUs see the path); empty: the destination chooses (a
	// TCP port of its host name).
	MigrateURI string
	// Tunnelled carries the guest's memory through the libvirtd
	// connection (VIR_MIGRATE_TUNNELLED) instead of a QEMU-to-QEMU TCP
	// stream on a port of the destination.
	Tunnelled bool
	// AutoConverge lets QEMU slow the guest's vCPUs when its memory
	// changes faster than it is sent.
	AutoConverge bool
	// BandwidthMiBps caps the migration stream in MiB/s; 0: no cap.
	BandwidthMiBps uint64
}

// MigrationStats is what libvirt measured of a completed migration (0
// when it did not say).
type MigrationStats struct {
	TotalMs    uint64 // from the start of the job to the guest running on the destination
	DowntimeMs uint64 // the guest paused between its last run on the source and its first on the destination
	DataBytes  uint64 // bytes of guest state sent (data_processed)
}

// migrator is the part of go-libvirt a migration uses; *libvirt.Libvirt
// implements it, the unit tests a fake.
type migrator interface {
	DomainLookupByName(name string) (libvirt.Domain, error)
	DomainLookupByUUID(uuid libvirt.UUID) (libvirt.Domain, error)
	DomainIsActive(d libvirt.Domain) (int32, error)
	DomainIsPersistent(d libvirt.Domain) (int32, error)
	DomainMigratePerform3Params(d libvirt.Domain, dconnuri libvirt.OptString, params []libvirt.TypedParam, cookie []byte, flags libvirt.DomainMigrateFlags) ([]byte, error)
	DomainAbortJob(d libvirt.Domain) error
	DomainGetJobStats(d libvirt.Domain, flags libvirt.DomainGetJobStatsFlags) (int32, []libvirt.TypedParam, error)
}

var _ migrator = (*libvirt.Libvirt)(nil)

// DialURI connects to the libvirtd of a libvirt URI (qemu:///system,
// qemu+unix:///system?socket=PATH, qemu+tcp://…, qemu+tls://…,
// qemu+ssh://…) through go-libvirt's dialer for its transport.
func DialURI(uri string) (*Libvirt, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("libvirt URI %q: %w", uri, err)
	}
	l, err := libvirt.ConnectToURI(u)
	if err != nil {
		return nil, fmt.Errorf("libvirt connect %s: %w", uri, err)
	}
	return &Libvirt{l: l}, nil
}

// lookup finds a domain by name, or by UUID when name is one that no
// domain has as its name (a policy names a VM either way).
func lookup(m migrator, name string) (libvirt.Domain, error) {
	d, err := m.DomainLookupByName(name)
	if err == nil || !libvirt.IsNotFound(err) {
		if err != nil {
			err = fmt.Errorf("DomainLookupByName %s: %w", name, err)
		}
		return d, err
	}
	u, ok := parseUUID(name)
	if !ok {
		return d, err
	}
	return m.DomainLookupByUUID(u)
}

// parseUUID reads a UUID in its 36-character form.
func parseUUID(s string) (libvirt.UUID, bool) {
	var u libvirt.UUID
	h := strings.ReplaceAll(s, "-", "")
	if len(s) != 36 || len(h) != 32 {
		return u, false
	}
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return u, false
	}
	return u, true
}

// Active tells whether the named domain (by name or UUID) runs on this
// libvirtd.
func (c *Libvirt) Active(name string) (bool, error) { return active(c.l, name) }

func active(m migrator, name string) (bool, error) {
	d, err := lookup(m, name)
	if libvirt.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	a, err := m.DomainIsActive(d)
	if err != nil {
		return false, fmt.Errorf("DomainIsActive %s: %w", name, err)
	}
	return a == 1, nil
}

// Migrate migrates the running domain name live from this libvirtd to
// m.DestURI and returns when it runs there. When ctx ends first the
// migration is aborted (the domain keeps running here). The statistics
// are libvirt's of the completed job: the source's, or the destination's
// when the source kept none (the domain is gone from it); zero when
// neither can say.
func (c *Libvirt) Migrate(ctx context.Context, name string, m Migration) (MigrationStats, error) {
	st, err := migrate(ctx, c.l, name, m)
	if err != nil || st != (MigrationStats{}) {
		return st, err
	}
	if dst, err := DialURI(m.DestURI); err == nil {
		defer dst.Close()
		st, _ = dst.CompletedJob(name)
	}
	return st, nil
}

// CompletedJob returns libvirt's statistics of the named domain's last
// completed job (on a migration's destination: the incoming migration).
func (c *Libvirt) CompletedJob(name string) (MigrationStats, error) {
	d, err := lookup(c.l, name)
	if err != nil {
		return MigrationStats{}, err
	}
	return completedStats(c.l, d)
}

// migrationFlags are the flags of a live peer-to-peer migration of a
// domain (persistent: its definition moves too).
func migrationFlags(m Migration, persistent bool) libvirt.DomainMigrateFlags {
	f := libvirt.MigrateLive | libvirt.MigratePeer2peer
	if m.Tunnelled {
		f |= libvirt.MigrateTunnelled
	}
	if m.AutoConverge {
		f |= libvirt.MigrateAutoConverge
	}
	if persistent {
		f |= libvirt.MigratePersistDest | libvirt.MigrateUndefineSource
	}
	return f
}

// migrationParams are the typed parameters of m.
func migrationParams(m Migration) []libvirt.TypedParam {
	var p []libvirt.TypedParam
	if m.DestXML != "" {
		p = append(p, libvirt.TypedParam{Field: libvirt.MigrateParamDestXML, Value: *libvirt.NewTypedParamValueString(m.DestXML)})
	}
	if m.MigrateURI != "" {
		p = append(p, libvirt.TypedParam{Field: libvirt.MigrateParamURI, Value: *libvirt.NewTypedParamValueString(m.MigrateURI)})
	}
	if m.BandwidthMiBps > 0 {
		p = append(p, libvirt.TypedParam{Field: libvirt.MigrateParamBandwidth, Value: *libvirt.NewTypedParamValueUllong(m.BandwidthMiBps)})
	}
	return p
}

func migrate(ctx context.Context, l migrator, name string, m Migration) (MigrationStats, error) {
	if m.DestURI == "" {
		return MigrationStats{}, fmt.Errorf("migrate %s: no destination URI", name)
	}
	d, err := lookup(l, name)
	if err != nil {
		if libvirt.IsNotFound(err) {
			return MigrationStats{}, fmt.Errorf("migrate %s: %w", name, ErrNotRunning)
		}
		return MigrationStats{}, err
	}
	if a, err := l.DomainIsActive(d); err != nil {
		return MigrationStats{}, fmt.Errorf("DomainIsActive %s: %w", name, err)
	} else if a != 1 {
		return MigrationStats{}, fmt.Errorf("migrate %s: %w", name, ErrNotRunning)
	}
	pers, err := l.DomainIsPersistent(d)
	if err != nil {
		return MigrationStats{}, fmt.Errorf("DomainIsPersistent %s: %w", name, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.DomainMigratePerform3Params(d, libvirt.OptString{m.DestURI}, migrationParams(m), nil, migrationFlags(m, pers == 1))
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		abortErr := l.DomainAbortJob(d)
		err = <-done // the source ends the job after the abort
		if err == nil {
			break // it completed before the abort took
		}
		return MigrationStats{}, errors.Join(fmt.Errorf("migrate %s to %s: %w", name, m.DestURI, ctx.Err()), err, abortErr)
	}
	if err != nil {
		return MigrationStats{}, fmt.Errorf("migrate %s to %s: %w", name, m.DestURI, err)
	}
	st, _ := completedStats(l, d)
	return st, nil
}

// completedStats reads the statistics of the domain's last completed
// job, leaving them for other readers (without KEEP_COMPLETED libvirt
// forgets them once read).
func completedStats(l migrator, d libvirt.Domain) (MigrationStats, error) {
	_, params, err := l.DomainGetJobStats(d, libvirt.DomainJobStatsCompleted|libvirt.DomainJobStatsKeepCompleted)
	if err != nil {
		return MigrationStats{}, err
	}
	var st MigrationStats
	for _, p := range params {
		v, ok := p.Value.I.(uint64)
		if !ok {
			continue
		}
		switch p.Field {
		case libvirt.DomainJobTimeElapsed:
			st.TotalMs = v
		case libvirt.DomainJobDowntime:
			st.DowntimeMs = v
		case libvirt.DomainJobDataProcessed:
			st.DataBytes = v
		}
	}
	return st, nil
}

// Duration returns a statistic in milliseconds as a time.Duration.
func Duration(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }

// Pull migrates a domain to this host from the peer that runs it: the
// executor of a migration on the destination, which knows where the
// domain should run but not where it runs now.
type Pull struct {
	// DestURI is this host's libvirtd as the peers' libvirtds reach it.
	DestURI string
	// DataURI is Migration.MigrateURI (empty: libvirt's choice).
	DataURI string
	// Peers are the other hosts' libvirtds (host name → URI) as this
	// process reaches them; they are asked in host name order.
	Peers map[string]string
	// Local is this host's libvirtd socket: a domain that runs there
	// already is not moved.
	Local string
}

// Migrate migrates the domain name live from the first peer whose
// libvirtd runs it to DestURI and returns that peer ("" when the domain
// runs here already) and libvirt's statistics.
func (p Pull) Migrate(ctx context.Context, name string) (string, MigrationStats, error) {
	if p.DestURI == "" {
		return "", MigrationStats{}, fmt.Errorf("migrate %s here: no destination URI", name)
	}
	if p.Local != "" {
		if c, err := Dial(p.Local); err == nil {
			here, _ := c.Active(name)
			c.Close()
			if here {
				return "", MigrationStats{}, nil
			}
		}
	}
	var hosts []string
	for h := range p.Peers {
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return "", MigrationStats{}, fmt.Errorf("migrate %s here: no peer to look for it", name)
	}
	sort.Strings(hosts)
	var errs []error
	for _, h := range hosts {
		c, err := DialURI(p.Peers[h])
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", h, err))
			continue
		}
		a, err := c.Active(name)
		if err != nil || !a {
			c.Close()
			if err != nil {
				errs = append(errs, fmt.Errorf("peer %s: %w", h, err))
			}
			continue
		}
		st, err := c.Migrate(ctx, name, Migration{DestURI: p.DestURI, MigrateURI: p.DataURI, AutoConverge: true})
		c.Close()
		if err != nil {
			return h, st, fmt.Errorf("from %s: %w", h, err)
		}
		return h, st, nil
	}
	return "", MigrationStats{}, errors.Join(append([]error{fmt.Errorf("%s runs on none of the peers %s", name, strings.Join(hosts, ", "))}, errs...)...)
}
