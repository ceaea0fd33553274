// Package storage is the host's storage gateway: it serves every VM disk of
// the host as an NBD export, schedules the disks' I/O with mClock
// (reservation, shares, limit per disk) into a dispatcher whose outstanding
// requests to the shared datastore never exceed the host window, and sets
// that window with PARDA from the datastore-wide latency that all hosts
// publish in a stats region of the datastore itself. It does not decide
// placement or admission, and it never acknowledges a write the datastore has
// not acknowledged.
package storage

import (
	"fmt"

	"sluice/policy"
)

// Layout constants: every disk starts on an AlignBytes boundary; the last
// StatsRegionBytes of the datastore export hold one StatsSlotBytes record per
// host (slot = index of the host in the policy's host list).
const (
	AlignBytes       = 1 << 20
	StatsRegionBytes = 1 << 20
	StatsSlotBytes   = 4096
	// DefaultDiskBytes is the size of a disk whose policy gives none.
	DefaultDiskBytes = 256 << 20
)

// Extent is where a disk lives inside its datastore's export.
type Extent struct {
	VM, Disk  string
	OffBytes  uint64
	SizeBytes uint64
}

// Name is the export name of the disk: "VM/DISK".
func (e Extent) Name() string { return e.VM + "/" + e.Disk }

// Layout places every disk of datastore ds, in policy order (VMs in file
// order, then their disks in order), one after the other, each aligned to
// AlignBytes. The layout depends only on the policy, so every host computes
// the same one, like files on a shared NFS datastore. The result includes
// disks of all hosts; RequiredBytes is the export size the datastore needs.
func Layout(p *policy.Policy, ds string) (extents []Extent, requiredBytes uint64) {
	var off uint64
	for _, vm := range p.VMs {
		for _, d := range vm.Disks {
			if d.Datastore != ds {
				continue
			}
			size := uint64(d.Size)
			if size == 0 {
				size = DefaultDiskBytes
			}
			extents = append(extents, Extent{VM: vm.Name, Disk: d.Name, OffBytes: off, SizeBytes: size})
			off += (size + AlignBytes - 1) / AlignBytes * AlignBytes
		}
	}
	return extents, off + StatsRegionBytes
}

// statsSlot is the byte offset of host's stats record in an export of
// exportBytes, or an error when the host is unknown or there are too many.
func statsSlot(p *policy.Policy, host string, exportBytes uint64) (uint64, error) {
	for i, h := range p.Hosts {
		if h.Name == host {
			if (i+1)*StatsSlotBytes > StatsRegionBytes {
				return 0, fmt.Errorf("host %s: more than %d hosts do not fit the stats region", host, StatsRegionBytes/StatsSlotBytes)
			}
			return exportBytes - StatsRegionBytes + uint64(i)*StatsSlotBytes, nil
		}
	}
	return 0, fmt.Errorf("host %s: not in the policy", host)
}
