package virt

import (
	"errors"
	"fmt"
	"strings"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/throttle"
)

var _ throttle.Hypervisor = (*Libvirt)(nil)

// BlockStats lists the disks of the running domains named in vms, with
// QEMU's cumulative counters (reads, writes and flushes, their bytes and
// total time). Domains that do not run are left out. The disks (targets,
// serials) come from each domain's live XML; the counters of all of them
// from one virConnectGetAllDomainStats call (VIR_DOMAIN_STATS_BLOCK),
// which QEMU answers with one query-blockstats per domain: the period's
// only requests on QEMU's monitor (before, two per disk).
func (c *Libvirt) BlockStats(vms []string) ([]throttle.HostDisk, error) {
	var errs []error
	var doms []libvirt.Domain
	var disks [][]Disk
	for _, name := range vms {
		x, err := c.LiveXML(name)
		if errors.Is(err, ErrNotRunning) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dom, err := ParseDomainXML(x)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := c.l.DomainLookupByName(name)
		if err != nil {
			if !libvirt.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("DomainLookupByName %s: %w", name, err))
			}
			continue
		}
		doms, disks = append(doms, d), append(disks, dom.Disks)
	}
	if len(doms) == 0 {
		return nil, errors.Join(errs...)
	}
	recs, err := c.l.ConnectGetAllDomainStats(doms, uint32(libvirt.DomainStatsBlock), 0)
	if err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("ConnectGetAllDomainStats (block) of %d domains: %w", len(doms), err))...)
	}
	byDomain := map[libvirt.UUID]map[string]throttle.Counters{}
	for _, r := range recs {
		byDomain[r.Dom.UUID] = blockStatsOf(r.Params)
	}
	var out []throttle.HostDisk
	for i, d := range doms {
		ctrs, ok := byDomain[d.UUID]
		if !ok {
			continue // stopped meanwhile
		}
		for _, k := range disks[i] {
			if ctr, ok := ctrs[k.Target]; ok && k.Target != "" {
				out = append(out, throttle.HostDisk{VM: d.Name, Target: k.Target, Serial: k.Serial, Counters: ctr})
			}
		}
	}
	return out, errors.Join(errs...)
}

// blockStatsOf sums a domain's block stats (libvirt's "block.N.*" typed
// parameters of VIR_DOMAIN_STATS_BLOCK) per disk target ("block.N.name")
// into operations (rd/wr/fl.reqs), bytes (rd/wr.bytes) and total time
// (rd/wr/fl.times, ns).
func blockStatsOf(ps []libvirt.TypedParam) map[string]throttle.Counters {
	names := map[string]string{} // N → target
	byN := map[string]throttle.Counters{}
	for _, p := range ps {
		rest, ok := strings.CutPrefix(p.Field, "block.")
		if !ok {
			continue
		}
		n, field, ok := strings.Cut(rest, ".")
		if !ok {
			continue
		}
		if field == "name" {
			if s, ok := p.Value.I.(string); ok {
				names[n] = s
			}
			continue
		}
		v, ok := uintOf(p.Value)
		if !ok {
			continue
		}
		c := byN[n]
		switch field {
		case "rd.reqs", "wr.reqs", "fl.reqs":
			c.Ops += v
		case "rd.bytes", "wr.bytes":
			c.Bytes += v
		case "rd.times", "wr.times", "fl.times":
			c.TimeNs += v
		default:
			continue
		}
		byN[n] = c
	}
	out := make(map[string]throttle.Counters, len(names))
	for n, target := range names {
		out[target] = byN[n]
	}
	return out
}

func uintOf(v libvirt.TypedParamValue) (uint64, bool) {
	switch x := v.I.(type) {
	case int64:
		if x >= 0 {
			return uint64(x), true
		}
	case uint64:
		return x, true
	case int32:
		if x >= 0 {
			return uint64(x), true
		}
	case uint32:
		return uint64(x), true
	}
	return 0, false
}

// iotuneFields are the block I/O tune fields the throttle driver sets,
// in libvirt's names (VIR_DOMAIN_BLOCK_IOTUNE_*).
var iotuneFields = []string{"total_iops_sec", "total_bytes_sec", "total_iops_sec_max", "total_bytes_sec_max",
	"total_iops_sec_max_length", "total_bytes_sec_max_length", "size_iops_sec"}

func (l throttleLimits) values() []uint64 {
	length := uint64(l.MaxLengthS)
	if l.IOPS == 0 {
		length = 0
	}
	return []uint64{uint64(l.IOPS), uint64(l.BytesPerS), uint64(l.MaxIOPS), uint64(l.MaxBytes), length, length, uint64(l.SizeIOPS)}
}

type throttleLimits throttle.Limits

// IOTune reads a running disk's throttle (virDomainGetBlockIoTune).
func (c *Libvirt) IOTune(vm, target string) (throttle.Limits, error) {
	d, err := c.l.DomainLookupByName(vm)
	if err != nil {
		return throttle.Limits{}, fmt.Errorf("DomainLookupByName %s: %w", vm, err)
	}
	disk := libvirt.OptString{target}
	_, n, err := c.l.DomainGetBlockIOTune(d, disk, 0, uint32(libvirt.DomainAffectLive))
	if err != nil {
		return throttle.Limits{}, fmt.Errorf("DomainGetBlockIOTune %s %s: %w", vm, target, err)
	}
	ps, _, err := c.l.DomainGetBlockIOTune(d, disk, n, uint32(libvirt.DomainAffectLive))
	if err != nil {
		return throttle.Limits{}, fmt.Errorf("DomainGetBlockIOTune %s %s: %w", vm, target, err)
	}
	var l throttle.Limits
	for _, p := range ps {
		v, ok := uintOf(p.Value)
		if !ok {
			continue
		}
		switch p.Field {
		case "total_iops_sec":
			l.IOPS = int64(v)
		case "total_bytes_sec":
			l.BytesPerS = int64(v)
		case "total_iops_sec_max":
			l.MaxIOPS = int64(v)
		case "total_bytes_sec_max":
			l.MaxBytes = int64(v)
		case "total_iops_sec_max_length":
			l.MaxLengthS = int64(v)
		case "size_iops_sec":
			l.SizeIOPS = int64(v)
		}
	}
	return l, nil
}

// SetIOTune sets a running disk's throttle (virDomainSetBlockIoTune, on
// the live domain only: the domain's definition keeps its own).
func (c *Libvirt) SetIOTune(vm, target string, l throttle.Limits) error {
	d, err := c.l.DomainLookupByName(vm)
	if err != nil {
		return fmt.Errorf("DomainLookupByName %s: %w", vm, err)
	}
	vals := throttleLimits(l).values()
	ps := make([]libvirt.TypedParam, 0, len(iotuneFields))
	for i, f := range iotuneFields {
		if (f == "total_iops_sec_max_length" || f == "total_bytes_sec_max_length") && vals[i] == 0 {
			continue // 0 is no valid length: left out, QEMU keeps its default
		}
		ps = append(ps, libvirt.TypedParam{Field: f, Value: *libvirt.NewTypedParamValueUllong(vals[i])})
	}
	if err := c.l.DomainSetBlockIOTune(d, target, ps, uint32(libvirt.DomainAffectLive)); err != nil {
		return fmt.Errorf("DomainSetBlockIOTune %s %s: %w", vm, target, err)
	}
	return nil
}
