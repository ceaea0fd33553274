package virt

import (
	"errors"
	"fmt"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/throttle"
)

var _ throttle.Hypervisor = (*Libvirt)(nil)

// BlockStats lists the disks of the running domains named in vms, with
// QEMU's cumulative counters (virDomainBlockStatsFlags: reads, writes and
// flushes, their bytes and total time). Domains that do not run are left
// out.
func (c *Libvirt) BlockStats(vms []string) ([]throttle.HostDisk, error) {
	var out []throttle.HostDisk
	var errs []error
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
			errs = append(errs, fmt.Errorf("DomainLookupByName %s: %w", name, err))
			continue
		}
		for _, k := range dom.Disks {
			if k.Target == "" {
				continue
			}
			ctr, err := c.blockCounters(d, k.Target)
			if err != nil {
				if libvirt.IsNotFound(err) {
					continue // stopped meanwhile
				}
				errs = append(errs, err)
				continue
			}
			out = append(out, throttle.HostDisk{VM: name, Target: k.Target, Serial: k.Serial, Counters: ctr})
		}
	}
	return out, errors.Join(errs...)
}

// blockCounters reads one disk's counters.
func (c *Libvirt) blockCounters(d libvirt.Domain, target string) (throttle.Counters, error) {
	_, n, err := c.l.DomainBlockStatsFlags(d, target, 0, 0)
	if err != nil {
		return throttle.Counters{}, fmt.Errorf("DomainBlockStatsFlags %s %s: %w", d.Name, target, err)
	}
	ps, _, err := c.l.DomainBlockStatsFlags(d, target, n, 0)
	if err != nil {
		return throttle.Counters{}, fmt.Errorf("DomainBlockStatsFlags %s %s: %w", d.Name, target, err)
	}
	return countersOf(ps), nil
}

// countersOf sums libvirt's block stats fields (VIR_DOMAIN_BLOCK_STATS_*)
// into operations, bytes and total time.
func countersOf(ps []libvirt.TypedParam) throttle.Counters {
	var c throttle.Counters
	for _, p := range ps {
		v, ok := uintOf(p.Value)
		if !ok {
			continue
		}
		switch p.Field {
		case "rd_operations", "wr_operations", "flush_operations":
			c.Ops += v
		case "rd_bytes", "wr_bytes":
			c.Bytes += v
		case "rd_total_times", "wr_total_times", "flush_total_times":
			c.TimeNs += v
		}
	}
	return c
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
