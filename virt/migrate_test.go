package virt

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
)

// fakeMigrator is a source libvirtd with domains that migrate: a
// migration that completes moves the domain to dests[uri] (the domain
// stops here, runs there); block holds a migration until AbortJob.
type fakeMigrator struct {
	mu         sync.Mutex
	active     map[string]bool
	persistent map[string]bool
	uuids      map[string]libvirt.UUID
	dests      map[string]map[string]bool // URI → domains running there
	block      bool
	aborted    chan struct{}
	calls      []string
	gotParams  []libvirt.TypedParam
	gotFlags   libvirt.DomainMigrateFlags
}

func newFakeMigrator() *fakeMigrator {
	return &fakeMigrator{active: map[string]bool{}, persistent: map[string]bool{}, uuids: map[string]libvirt.UUID{}, dests: map[string]map[string]bool{}, aborted: make(chan struct{})}
}

func (f *fakeMigrator) DomainLookupByName(name string) (libvirt.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.active[name]; !ok {
		return libvirt.Domain{}, libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: "Domain not found: " + name}
	}
	return libvirt.Domain{Name: name}, nil
}

func (f *fakeMigrator) DomainLookupByUUID(u libvirt.UUID) (libvirt.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, uu := range f.uuids {
		if uu == u {
			return libvirt.Domain{Name: name, UUID: u}, nil
		}
	}
	return libvirt.Domain{}, libvirt.Error{Code: uint32(libvirt.ErrNoDomain), Message: "Domain not found: no domain with matching uuid"}
}

func (f *fakeMigrator) DomainIsActive(d libvirt.Domain) (int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active[d.Name] {
		return 1, nil
	}
	return 0, nil
}

func (f *fakeMigrator) DomainIsPersistent(d libvirt.Domain) (int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.persistent[d.Name] {
		return 1, nil
	}
	return 0, nil
}

func (f *fakeMigrator) DomainMigratePerform3Params(d libvirt.Domain, uri libvirt.OptString, params []libvirt.TypedParam, _ []byte, flags libvirt.DomainMigrateFlags) ([]byte, error) {
	f.mu.Lock()
	f.calls = append(f.calls, "perform "+d.Name+" "+strings.Join(uri, ","))
	f.gotParams, f.gotFlags = params, flags
	block := f.block
	f.mu.Unlock()
	if block {
		<-f.aborted
		return nil, libvirt.Error{Code: uint32(libvirt.ErrOperationAborted), Message: "operation aborted: migration out job: canceled by client"}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	dst, ok := f.dests[uri[0]]
	if !ok {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrOperationFailed), Message: "Failed to connect to remote libvirt URI " + uri[0]}
	}
	f.active[d.Name] = false
	dst[d.Name] = true
	return nil, nil
}

func (f *fakeMigrator) DomainAbortJob(d libvirt.Domain) error {
	f.mu.Lock()
	f.calls = append(f.calls, "abort "+d.Name)
	f.mu.Unlock()
	close(f.aborted)
	return nil
}

func (f *fakeMigrator) DomainGetJobStats(d libvirt.Domain, flags libvirt.DomainGetJobStatsFlags) (int32, []libvirt.TypedParam, error) {
	if flags != libvirt.DomainJobStatsCompleted|libvirt.DomainJobStatsKeepCompleted {
		return 0, nil, errors.New("want the completed job, kept for other readers")
	}
	return 3, []libvirt.TypedParam{
		{Field: libvirt.DomainJobTimeElapsed, Value: *libvirt.NewTypedParamValueUllong(1834)},
		{Field: libvirt.DomainJobDowntime, Value: *libvirt.NewTypedParamValueUllong(41)},
		{Field: libvirt.DomainJobDataTotal, Value: *libvirt.NewTypedParamValueUllong(268435456)},
		{Field: libvirt.DomainJobDataProcessed, Value: *libvirt.NewTypedParamValueUllong(105356288)},
		{Field: "memory_dirty_rate", Value: *libvirt.NewTypedParamValueUllong(7)},
	}, nil
}

func TestMigrateMovesTheDomain(t *testing.T) {
	f := newFakeMigrator()
	f.active["web1"], f.persistent["web1"] = true, true
	dest := "qemu+tls://h2.example/system"
	f.dests[dest] = map[string]bool{}
	st, err := migrate(context.Background(), f, "web1", Migration{DestURI: dest, DestXML: "<domain/>", MigrateURI: "tcp://10.0.0.2:49152", AutoConverge: true, BandwidthMiBps: 100})
	if err != nil {
		t.Fatal(err)
	}
	if f.active["web1"] || !f.dests[dest]["web1"] {
		t.Errorf("after the migration: runs here %v, there %v; want only there", f.active["web1"], f.dests[dest]["web1"])
	}
	want := libvirt.MigrateLive | libvirt.MigratePeer2peer | libvirt.MigrateAutoConverge | libvirt.MigratePersistDest | libvirt.MigrateUndefineSource
	if f.gotFlags != want {
		t.Errorf("flags %#x, want %#x (live, peer to peer, auto-converge, the definition moves)", f.gotFlags, want)
	}
	if len(f.gotParams) != 3 || f.gotParams[0].Field != "destination_xml" || f.gotParams[0].Value.I != "<domain/>" ||
		f.gotParams[1].Field != "migrate_uri" || f.gotParams[1].Value.I != "tcp://10.0.0.2:49152" ||
		f.gotParams[2].Field != "bandwidth" || f.gotParams[2].Value.I != uint64(100) {
		t.Errorf("params %+v, want destination_xml, migrate_uri and bandwidth", f.gotParams)
	}
	if st != (MigrationStats{TotalMs: 1834, DowntimeMs: 41, DataBytes: 105356288}) {
		t.Errorf("stats %+v", st)
	}
}

func TestMigrateTransientTunnelled(t *testing.T) {
	f := newFakeMigrator()
	f.active["vm1"] = true
	f.dests["u"] = map[string]bool{}
	if _, err := migrate(context.Background(), f, "vm1", Migration{DestURI: "u", Tunnelled: true}); err != nil {
		t.Fatal(err)
	}
	if want := libvirt.MigrateLive | libvirt.MigratePeer2peer | libvirt.MigrateTunnelled; f.gotFlags != want {
		t.Errorf("flags %#x, want %#x: a transient domain stays transient", f.gotFlags, want)
	}
	if len(f.gotParams) != 0 {
		t.Errorf("params %+v, want none", f.gotParams)
	}
}

func TestMigrateErrors(t *testing.T) {
	f := newFakeMigrator()
	f.active["vm1"] = true
	f.active["off"] = false
	for _, c := range []struct {
		vm, uri, want string
	}{
		{"vm1", "", "migrate vm1: no destination URI"},
		{"nope", "u", "migrate nope: domain is not running"},
		{"off", "u", "migrate off: domain is not running"},
		{"vm1", "qemu+tls://h9/system", "migrate vm1 to qemu+tls://h9/system: Failed to connect to remote libvirt URI qemu+tls://h9/system"},
	} {
		_, err := migrate(context.Background(), f, c.vm, Migration{DestURI: c.uri})
		if err == nil || err.Error() != c.want {
			t.Errorf("migrate %s to %q: error %v, want %q", c.vm, c.uri, err, c.want)
		}
	}
	if !f.active["vm1"] {
		t.Error("a failed migration stopped the domain here")
	}
}

func TestMigrateAbortsWhenCanceled(t *testing.T) {
	f := newFakeMigrator()
	f.active["vm1"], f.block = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := migrate(ctx, f, "vm1", Migration{DestURI: "u"})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "canceled by client") {
		t.Errorf("error %v, want the deadline and libvirt's abort", err)
	}
	if got := strings.Join(f.calls, "; "); got != "perform vm1 u; abort vm1" {
		t.Errorf("calls %q", got)
	}
	if !f.active["vm1"] {
		t.Error("an aborted migration stopped the domain here")
	}
}

func TestActive(t *testing.T) {
	f := newFakeMigrator()
	f.active["a"], f.active["b"] = true, false
	f.uuids["a"] = libvirt.UUID{0x6f, 0x1d, 0x0c, 0x2e, 0x8a, 0x4b, 0x4c, 0x1e, 0x9d, 0x0f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70}
	for name, want := range map[string]bool{"a": true, "b": false, "c": false,
		"6F1D0C2E-8A4B-4C1E-9D0F-2B3C4D5E6F70": true, "6f1d0c2e-8a4b-4c1e-9d0f-2b3c4d5e6f71": false, "6f1d0c2e8a4b4c1e9d0f2b3c4d5e6f70": false} {
		if got, err := active(f, name); err != nil || got != want {
			t.Errorf("active(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
}

// TestPullErrors: the destination's executor says what it lacks, and
// names every peer it could not ask.
func TestPullErrors(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, c := range []struct {
		p    Pull
		want string
	}{
		{Pull{}, "migrate vm1 here: no destination URI"},
		{Pull{DestURI: "qemu+tls://h2/system"}, "migrate vm1 here: no peer to look for it"},
		{Pull{DestURI: "qemu+tls://h2/system", Local: dir + "/local-sock", Peers: map[string]string{
			"h3": "qemu+unix:///system?socket=" + dir + "/h3-sock", "h1": "qemu+unix:///system?socket=" + dir + "/h1-sock"}},
			"vm1 runs on none of the peers h1, h3\npeer h1: libvirt connect qemu+unix:///system?socket=" + dir + "/h1-sock: "},
		{Pull{DestURI: "qemu+tls://h2/system", Peers: map[string]string{"h1": "%zz"}}, `vm1 runs on none of the peers h1
peer h1: libvirt URI "%zz": parse "%zz": invalid URL escape "%zz"`},
	} {
		from, _, err := c.p.Migrate(ctx, "vm1")
		if err == nil || from != "" || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: from %q, error %v; want %q", c.p, from, err, c.want)
		}
	}
}

// TestMigrateByUUID: a VM the policy names by UUID migrates as well.
func TestMigrateByUUID(t *testing.T) {
	f := newFakeMigrator()
	f.active["web1"] = true
	f.uuids["web1"] = libvirt.UUID{0x6f, 0x1d, 0x0c, 0x2e, 0x8a, 0x4b, 0x4c, 0x1e, 0x9d, 0x0f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70}
	f.dests["u"] = map[string]bool{}
	if _, err := migrate(context.Background(), f, "6f1d0c2e-8a4b-4c1e-9d0f-2b3c4d5e6f70", Migration{DestURI: "u"}); err != nil {
		t.Fatal(err)
	}
	if f.active["web1"] || !f.dests["u"]["web1"] {
		t.Errorf("web1 runs here %v, there %v; want only there", f.active["web1"], f.dests["u"]["web1"])
	}
}
