// Package dirstats keeps a datastore's shared stats for the throttle
// driver as files in the datastore's own directory (a local file system
// or an NFS mount that every host mounts): each host writes its record to
// DIR/.sluice-throttle/HOST.rec (a whole file, renamed into place, so a
// reader sees the old record or the new one) and reads every host's.
// This is what vSphere's SIOC does with a file on the datastore: no
// controller, no network between the hosts.
package dirstats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sluice/parda"
)

// Subdir is the directory of the records inside a datastore's directory.
const Subdir = ".sluice-throttle"

// Dir is the stats of the datastore whose directory is Path, as host Host
// writes them.
type Dir struct {
	Path string
	Host string
}

func (d Dir) dir() string { return filepath.Join(d.Path, Subdir) }

// Read returns every host's record; files that hold no valid record
// (torn, foreign) are skipped. A missing directory is no record yet.
func (d Dir) Read() ([]parda.Record, error) {
	ents, err := os.ReadDir(d.dir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []parda.Record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".rec") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.dir(), e.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		if r, ok := parda.DecodeRecord(b); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// Write replaces this host's record.
func (d Dir) Write(r parda.Record) error {
	if r.Host != d.Host {
		return fmt.Errorf("record of host %q written as %q", r.Host, d.Host)
	}
	if err := os.MkdirAll(d.dir(), 0o755); err != nil {
		return err
	}
	p := filepath.Join(d.dir(), d.Host+".rec")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, r.Encode(parda.RecordBytes), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// ProbeName is the file of a datastore's directory that the throttle
// driver's hosts read to measure the datastore's latency below QEMU's
// throttles (also an export of an NBD server serving the directory).
const ProbeName = "sluice-probe"

// ProbeBytes is the size of the probe file.
const ProbeBytes = 16 << 20

// EnsureProbe makes the probe file in dir if it is missing: ProbeBytes of
// data (written, not sparse, so that a read reaches the device).
func EnsureProbe(dir string) (string, error) {
	p := filepath.Join(dir, ProbeName)
	if st, err := os.Stat(p); err == nil && st.Size() >= ProbeBytes {
		return p, nil
	}
	buf := make([]byte, ProbeBytes)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return "", err
	}
	return p, os.Rename(tmp, p)
}
