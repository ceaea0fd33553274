package sim

import (
	"fmt"
	"math"

	"sluice/alloc"
	"sluice/entitle"
)

// iopsErrors are the per-sample relative errors of disks' IOPS against
// their entitlements over [fromNs, toNs): for each sample, every disk of
// the datastore is entitled by the storage derivation (entitle.StorageRoot,
// entitle.DiskNode, alloc.Compute: mClock's floor semantics, with each
// disk's R/S/L in force at the sample's start) to a part of the IOPS the
// datastore's disks did together in that sample, a disk with I/O in the
// window wanting more in each of its samples (unbounded demand), one
// without wanting none; the
// error is |IOPS − entitlement| / entitlement. of is a disk (VM/DISK: its
// samples) or a datastore (every disk's samples). The measure means
// something where every disk with I/O is backlogged (congestion).
func (s *Sim) iopsErrors(of string, fromNs, toNs int64) ([]float64, error) {
	pairs, err := s.iopsEntitled(of, fromNs, toNs)
	errs := make([]float64, len(pairs))
	for i, p := range pairs {
		errs[i] = math.Abs(p[0]-p[1]) / p[1]
	}
	return errs, err
}

// iopsEntitled are the (IOPS, entitlement) pairs of iopsErrors: a disk's,
// or every disk's of a datastore, per sample with an entitlement.
func (s *Sim) iopsEntitled(of string, fromNs, toNs int64) ([][2]float64, error) {
	var ds *datastore
	var only *diskState
	if d := s.disks[of]; d != nil {
		only = d
		for _, name := range sortedKeys(s.dstores) {
			for _, dk := range s.dstores[name].dks {
				if dk == d {
					ds = s.dstores[name]
				}
			}
		}
	} else {
		ds = s.dstores[of]
	}
	if ds == nil {
		return nil, fmt.Errorf("iops_error: unknown disk or datastore %q", of)
	}
	ivNs := s.rec.IntervalNs
	iv := float64(ivNs) / 1e9
	a, b := s.rec.window(fromNs, toNs)
	active := make([]bool, len(ds.dks))
	for j, dk := range ds.dks {
		for i := a; i < b && i < len(dk.iops.Sum); i++ {
			active[j] = active[j] || dk.iops.Sum[i] > 0
		}
	}
	var pairs [][2]float64
	for i := a; i < b; i++ {
		root := entitle.StorageRoot(ds.name)
		iops := make([]float64, len(ds.dks))
		total := 0.0
		for j, dk := range ds.dks {
			if i < len(dk.iops.Sum) {
				iops[j] = dk.iops.Sum[i] / iv
			}
			total += iops[j]
			demand := 0.0
			if active[j] {
				demand = alloc.Inf
			}
			root.Children = append(root.Children, entitle.DiskNode(dk.specAtNs(int64(i)*ivNs), demand))
		}
		if total == 0 {
			continue
		}
		alloc.Compute(root, total)
		for j, dk := range ds.dks {
			e := root.Children[j].Alloc
			if (only != nil && dk != only) || e <= 0 {
				continue
			}
			pairs = append(pairs, [2]float64{iops[j], e})
		}
	}
	return pairs, nil
}

// iopsVsEntitled is a disk's IOPS over [fromNs, toNs) as a fraction of
// its entitlement over the same samples (metric iops_ent): what the
// throttle driver's live test judges ("within 10% of entitle.Storage over
// the IOPS all the disks did").
func (s *Sim) iopsVsEntitled(of string, fromNs, toNs int64) (float64, error) {
	if s.disks[of] == nil {
		return 0, fmt.Errorf("iops_ent: unknown disk %q", of)
	}
	pairs, err := s.iopsEntitled(of, fromNs, toNs)
	if err != nil {
		return 0, err
	}
	var x, e float64
	for _, p := range pairs {
		x, e = x+p[0], e+p[1]
	}
	if e == 0 {
		return 0, fmt.Errorf("iops_ent: no I/O of %s in the window", of)
	}
	return x / e, nil
}

// iopsError is the mean of iopsErrors (metric iops_error).
func (s *Sim) iopsError(of string, fromNs, toNs int64) (float64, error) {
	errs, err := s.iopsErrors(of, fromNs, toNs)
	if err != nil {
		return 0, err
	}
	if len(errs) == 0 {
		return 0, fmt.Errorf("iops_error: no I/O of %s in the window", of)
	}
	sum := 0.0
	for _, e := range errs {
		sum += e
	}
	return sum / float64(len(errs)), nil
}

// specAtNs is the disk's R/S/L in force at atNs.
func (dk *diskState) specAtNs(atNs int64) entitle.DiskSpec {
	sp := dk.specs[0].spec
	for _, x := range dk.specs[1:] {
		if x.atNs <= atNs {
			sp = x.spec
		}
	}
	return sp
}
