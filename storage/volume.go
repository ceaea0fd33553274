package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"sluice/internal/clock"
	"sluice/storage/nbd"
)

// volume is one volume of a datastore: a disk image or the stats volume.
type volume interface {
	sizeBytes() uint64
	readAt(p []byte, off uint64) error
	writeAt(p []byte, off uint64, fua bool) error
	flush() error
	trim(off, n uint64) error
	// close releases the volume (requests in flight finish first); abort
	// fails requests in flight at once.
	close()
	abort()
}

// store is a datastore as the gateway reaches it.
type store interface {
	// open opens volume name; onRedial (NBD only; may be nil) checks every
	// replacement connection of the volume before its first request.
	open(name string, onRedial func(c *nbd.Client) error) (volume, error)
	String() string
}

// openStore parses a datastore location: "dir:PATH" or an absolute PATH
// (a directory of volumes: a local file system or an NFS mount), or an NBD
// server "nbd://HOST[:PORT]" or "nbd+unix:///?socket=PATH" serving one
// export per volume (nbdkit's file plugin with dir=, qemu-storage-daemon).
func openStore(clk clock.Clock, loc string, pollNs int64) (store, error) {
	if dir, ok := strings.CutPrefix(loc, "dir:"); ok || strings.HasPrefix(loc, "/") {
		if !ok {
			dir = loc
		}
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory", dir)
		}
		return &dirStore{dir: dir}, nil
	}
	network, addr, export, err := nbd.ParseURI(loc)
	if err != nil {
		return nil, err
	}
	if export != "" {
		return nil, fmt.Errorf("%s: give the server only (nbd://HOST:PORT): every disk is its own export, named VM+DISK.img", loc)
	}
	return &nbdStore{clk: clk, network: network, addr: addr, pollNs: pollNs, loc: loc}, nil
}

// errMissing is the error of a volume that is not on the datastore.
var errMissing = errors.New("missing")

// dirStore is a directory of volume files.
type dirStore struct{ dir string }

func (s *dirStore) String() string { return "dir:" + s.dir }

func (s *dirStore) open(name string, _ func(*nbd.Client) error) (volume, error) {
	return openFileVolume(filepath.Join(s.dir, name))
}

// ioErr is an error from a volume file as the VM sees it: EIO, keeping
// ENOSPC.
func ioErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %v", &nbd.Error{Errno: nbd.ENOSPC}, err)
	}
	return fmt.Errorf("%w: %v", &nbd.Error{Errno: nbd.EIO}, err)
}

// nbdStore is an NBD server with one export per volume.
type nbdStore struct {
	clk           clock.Clock
	network, addr string
	pollNs        int64
	loc           string
}

func (s *nbdStore) String() string { return s.loc }

func (s *nbdStore) open(name string, onRedial func(*nbd.Client) error) (volume, error) {
	u := newUpstream(s.clk, s.network, s.addr, name, s.pollNs)
	c, err := u.get()
	if err != nil {
		if strings.Contains(err.Error(), "server error") {
			return nil, fmt.Errorf("volume %s on %s: %w (%v)", name, s.loc, errMissing, err)
		}
		return nil, fmt.Errorf("volume %s on %s: %w", name, s.loc, err)
	}
	size := c.SizeBytes()
	u.onRedial = func(c *nbd.Client) error {
		if c.SizeBytes() != size {
			return fmt.Errorf("size changed from %d to %d bytes: not the same volume", size, c.SizeBytes())
		}
		if onRedial != nil {
			return onRedial(c)
		}
		return nil
	}
	return &nbdVolume{up: u, size: size}, nil
}

// nbdVolume is a volume served by an NBD server.
type nbdVolume struct {
	up   *upstream
	size uint64
}

func (v *nbdVolume) sizeBytes() uint64 { return v.size }

func (v *nbdVolume) readAt(p []byte, off uint64) error {
	return v.up.do(func(c *nbd.Client) error { return c.ReadAt(p, off) })
}

func (v *nbdVolume) writeAt(p []byte, off uint64, fua bool) error {
	return v.up.do(func(c *nbd.Client) error { return c.WriteAt(p, off, fua) })
}

func (v *nbdVolume) flush() error {
	return v.up.do(func(c *nbd.Client) error { return c.Flush() })
}

func (v *nbdVolume) trim(off, n uint64) error {
	return v.up.do(func(c *nbd.Client) error { return c.Trim(off, n) })
}

func (v *nbdVolume) close() { v.up.close() }
func (v *nbdVolume) abort() { v.up.abort() }
