// Package storage is the host's storage gateway: it serves every VM disk of
// the host as an NBD export, schedules the disks' I/O with mClock
// (reservation, shares, limit per disk) into a dispatcher whose outstanding
// requests to the shared datastore never exceed the host window, and sets
// that window with PARDA from the datastore-wide latency that all hosts
// publish in a stats volume of the datastore itself. It does not decide
// placement or admission, and it never acknowledges a write the datastore has
// not acknowledged.
package storage

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"sluice/policy"
)

// A datastore holds one volume (an image file, or an NBD export) per VM
// disk, found by name (VolumeName), and the stats volume StatsVolume: a
// header naming the datastore (a random identity written once, when the
// datastore is prepared) followed by one StatsSlotBytes record per host,
// each record carrying its host's name.
const (
	StatsVolume      = "sluice-stats"
	StatsVolumeBytes = 1 << 20
	statsHeaderBytes = 4096
	StatsSlotBytes   = 4096
	statsSlots       = (StatsVolumeBytes - statsHeaderBytes) / StatsSlotBytes
	// DefaultDiskBytes is the size of a disk whose policy gives none.
	DefaultDiskBytes = 256 << 20
)

// VolumeName is the name of the volume of disk DISK of VM VM: the file
// name in a directory datastore and the export name on an NBD datastore,
// "VM+DISK.img" (policy names never contain '+', so the name is
// unambiguous, and it has no '/', which nbdkit's file plugin refuses).
func VolumeName(vm, disk string) string { return vm + "+" + disk + ".img" }

// Volume is one disk's volume on a datastore.
type Volume struct {
	VM, Disk  string
	SizeBytes uint64 // the disk's size from the policy
}

// Name is the volume's name on the datastore (VolumeName).
func (v Volume) Name() string { return VolumeName(v.VM, v.Disk) }

// Export is the name under which the gateway serves the disk: "VM/DISK".
func (v Volume) Export() string { return v.VM + "/" + v.Disk }

// DiskBytes is the size of policy disk d.
func DiskBytes(d policy.Disk) uint64 {
	if d.Size > 0 {
		return uint64(d.Size)
	}
	return DefaultDiskBytes
}

// Volumes lists the volumes of every disk of datastore ds in the policy
// (all hosts). Neither the order of VMs nor that of hosts matters: a
// volume is found by its name.
func Volumes(p *policy.Policy, ds string) []Volume {
	var out []Volume
	for _, vm := range p.VMs {
		for _, d := range vm.Disks {
			if d.Datastore == ds {
				out = append(out, Volume{VM: vm.Name, Disk: d.Name, SizeBytes: DiskBytes(d)})
			}
		}
	}
	return out
}

// datastoreID is the identity in a stats volume's header.
type datastoreID [16]byte

func (id datastoreID) String() string { return fmt.Sprintf("%x", id[:]) }

const idMagic = 0x534c445349443031 // "SLDSID01"

// encodeHeader is the stats volume's header block: magic u64 | id [16] |
// crc32 of the 24 bytes before.
func encodeHeader(id datastoreID) []byte {
	b := make([]byte, statsHeaderBytes)
	binary.BigEndian.PutUint64(b, idMagic)
	copy(b[8:24], id[:])
	binary.BigEndian.PutUint32(b[24:], crc32.ChecksumIEEE(b[:24]))
	return b
}

// decodeHeader returns the identity in a header block, false when there is
// none (an empty or foreign volume).
func decodeHeader(b []byte) (datastoreID, bool) {
	var id datastoreID
	if len(b) < 28 || binary.BigEndian.Uint64(b) != idMagic || crc32.ChecksumIEEE(b[:24]) != binary.BigEndian.Uint32(b[24:]) {
		return id, false
	}
	copy(id[:], b[8:24])
	return id, true
}

// CreateVolumes prepares directory dir as datastore ds of policy p: it
// creates the stats volume with a new identity if it is missing, and every
// missing volume of the datastore's disks as a sparse file of the disk's
// size. An existing volume is kept as it is (never truncated or
// overwritten); one smaller than its disk is an error. It returns the
// names of the files it created. The directory must exist: a missing
// mount point is not silently replaced by a local directory.
func CreateVolumes(dir string, p *policy.Policy, ds string) ([]string, error) {
	if _, ok := dsByName(p, ds); !ok {
		return nil, fmt.Errorf("datastore %s: not in the policy", ds)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("datastore %s: %w", ds, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("datastore %s: %s is not a directory", ds, dir)
	}
	var created []string
	stats := filepath.Join(dir, StatsVolume)
	if _, err := os.Stat(stats); errors.Is(err, os.ErrNotExist) {
		var id datastoreID
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
		b := make([]byte, StatsVolumeBytes)
		copy(b, encodeHeader(id))
		// Written aside and linked into place: link fails if another
		// preparer won the race, whose identity then stands.
		tmp, err := os.CreateTemp(dir, ".sluice-stats-*")
		if err != nil {
			return nil, fmt.Errorf("datastore %s: %w", ds, err)
		}
		_, werr := tmp.Write(b)
		if werr == nil {
			werr = tmp.Sync()
		}
		tmp.Close()
		if werr == nil {
			werr = os.Link(tmp.Name(), stats)
		}
		os.Remove(tmp.Name())
		if werr != nil && !errors.Is(werr, os.ErrExist) {
			return nil, fmt.Errorf("datastore %s: %w", ds, werr)
		}
		if werr == nil {
			created = append(created, StatsVolume)
		}
	} else if err != nil {
		return nil, fmt.Errorf("datastore %s: %w", ds, err)
	}
	for _, v := range Volumes(p, ds) {
		path := filepath.Join(dir, v.Name())
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o660)
		if errors.Is(err, os.ErrExist) {
			fi, err := os.Stat(path)
			if err != nil {
				return created, fmt.Errorf("datastore %s: %w", ds, err)
			}
			if uint64(fi.Size()) < v.SizeBytes {
				return created, fmt.Errorf("datastore %s: volume %s has %d bytes, disk %s needs %d", ds, path, fi.Size(), v.Export(), v.SizeBytes)
			}
			continue
		}
		if err != nil {
			return created, fmt.Errorf("datastore %s: %w", ds, err)
		}
		err = f.Truncate(int64(v.SizeBytes))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return created, fmt.Errorf("datastore %s: %w", ds, err)
		}
		created = append(created, v.Name())
	}
	return created, nil
}
