package entitle

import (
	"fmt"
	"math"

	"sluice/alloc"
	"sluice/policy"
)

// Store is the storage entitlement of one datastore: a flat tree of its
// disks under floor semantics (mClock: each disk gets max(R, its share),
// capped by its limit and demand), capacity in IOPS.
type Store struct {
	Datastore    string
	CapacityIOPS float64
	Root         *alloc.Node
	Disks        []*Disk

	byName map[string]*Disk
	solver alloc.Solver
}

// Disk is one VM disk on the datastore, named VM/DISK.
type Disk struct {
	Name string // VM/DISK
	VM   string
	Host string // the VM's host: the storage gateway its I/O passes
	Node *alloc.Node
}

// Storage builds the tree of datastore ds's disks and computes their
// entitlements. capacityIOPS is what the datastore serves now (measured,
// or the policy's: ds.NominalIOPS()); 0 means the policy's.
// demandIOPS gives demands by disk name (VM/DISK); others are unbounded;
// alloc.Inf means unbounded. Disks of VMs without a host are skipped (their
// I/O goes through no gateway). A name that is no disk on ds is an error.
func Storage(p *policy.Policy, ds string, capacityIOPS float64, demandIOPS map[string]float64) (*Store, error) {
	d := p.Datastore(ds)
	if d == nil {
		return nil, fmt.Errorf("%s: no such datastore", ds)
	}
	if capacityIOPS <= 0 {
		capacityIOPS = IOPSLimit(d.NominalIOPS())
	}
	s := &Store{
		Datastore: ds, CapacityIOPS: capacityIOPS,
		Root:   StorageRoot(ds),
		byName: map[string]*Disk{},
	}
	for _, dk := range Derive(p, Live{}).Datastore(ds).Disks {
		n := DiskNode(dk, alloc.Inf)
		s.Root.Children = append(s.Root.Children, n)
		disk := &Disk{Name: n.Name, VM: dk.VM, Host: dk.Host, Node: n}
		s.Disks = append(s.Disks, disk)
		s.byName[n.Name] = disk
	}
	for name, v := range demandIOPS {
		if err := s.SetDemand(name, v); err != nil {
			return nil, err
		}
	}
	s.Compute()
	return s, nil
}

// StorageRoot is the root of a datastore's disks under floor semantics
// (mClock: each disk gets max(R, its share), capped by its limit and
// demand). Add DiskNode children and alloc.Compute it with the capacity
// in IOPS. The gateway, the throttle driver, the simulator and explain
// all divide a datastore this way.
func StorageRoot(name string) *alloc.Node {
	return &alloc.Node{Name: name, Limit: alloc.Inf, Demand: alloc.Inf, Semantics: alloc.Floor}
}

// DiskNode is disk d's node under a StorageRoot: its reservation, shares
// and limit in IOPS (alloc.Inf: unlimited) and demandIOPS (alloc.Inf:
// unbounded). Shares below 1 count as 1.
func DiskNode(d DiskSpec, demandIOPS float64) *alloc.Node {
	return &alloc.Node{Name: d.Name, Reservation: d.ReservationIOPS, Shares: math.Max(d.Shares, 1), Limit: d.LimitIOPS, Demand: demandIOPS}
}

// SetDemand sets the named disk's demand in IOPS (alloc.Inf: unbounded).
// Call Compute afterwards.
func (s *Store) SetDemand(name string, v float64) error {
	d := s.byName[name]
	if d == nil {
		return fmt.Errorf("%s: no such disk on datastore %s (disks are VM/DISK of a placed VM)", name, s.Datastore)
	}
	if math.IsNaN(v) || v < 0 {
		return fmt.Errorf("%s: demand must be ≥ 0", name)
	}
	d.Node.Demand = v
	return nil
}

// Compute recomputes the entitlements with the current demands and
// capacity; it allocates nothing once it has run on the same tree.
func (s *Store) Compute() { s.solver.Compute(s.Root, s.CapacityIOPS) }

// Disk returns the named disk (VM/DISK), or nil.
func (s *Store) Disk(name string) *Disk { return s.byName[name] }

// HostShares sums the shares of the disks of each host that have demand:
// what PARDA divides the datastore's queue among (SIOC).
func (s *Store) HostShares() map[string]float64 {
	m := map[string]float64{}
	for _, d := range s.Disks {
		if d.Node.EffDemand > 0 {
			m[d.Host] += d.Node.Shares
		}
	}
	return m
}
