package throttle

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"sluice/entitle"
	"sluice/parda"
)

// HostDisk is one disk of a running domain as the hypervisor shows it.
type HostDisk struct {
	VM       string // the domain's name
	Target   string // target dev (vda)
	Serial   string // <serial>, "" when none
	Counters Counters
}

// Hypervisor is what the driver needs of libvirt (package virt implements
// it; tests use a fake).
type Hypervisor interface {
	// BlockStats lists the disks of the running domains named in vms
	// with their cumulative counters. A domain that is not running is
	// left out, not an error.
	BlockStats(vms []string) ([]HostDisk, error)
	// IOTune returns a disk's throttle as it is now.
	IOTune(vm, target string) (Limits, error)
	// SetIOTune sets a disk's throttle on the running domain.
	SetIOTune(vm, target string, l Limits) error
}

// Stats is the datastore's shared stats: every host writes its own
// record and reads every host's (a file per host in a directory of the
// datastore, as SIOC keeps a file on the datastore).
type Stats interface {
	Read() ([]parda.Record, error)
	Write(parda.Record) error
}

// Match names the hypervisor's disks by the policy: disk VM/DISK is the
// disk of domain domain(VM) whose serial is DISK, else whose target dev
// is DISK (domain nil: the domain is named as the VM). It returns, in
// specs order, the specs found and their disks; specs of VMs not running
// here, or without such a disk, are left out.
func Match(specs []entitle.DiskSpec, disks []HostDisk, domain func(vm string) string) ([]entitle.DiskSpec, []HostDisk) {
	var ms []entitle.DiskSpec
	var hs []HostDisk
	for _, s := range specs {
		dom := s.VM
		if domain != nil {
			dom = domain(s.VM)
		}
		i := slices.IndexFunc(disks, func(h HostDisk) bool { return h.VM == dom && h.Serial == s.Disk })
		if i < 0 {
			i = slices.IndexFunc(disks, func(h HostDisk) bool { return h.VM == dom && h.Target == s.Disk })
		}
		if i >= 0 {
			ms, hs = append(ms, s), append(hs, disks[i])
		}
	}
	return ms, hs
}

// Driver runs the throttle driver's periods for one datastore on one
// host: it reads the counters and the stats, runs Step, sets the
// throttles that changed and publishes the host's record. It remembers
// each disk's throttle from before sluice first set it (Originals), so
// that Restore can give it back.
type Driver struct {
	Host, Datastore string
	Ctl             *parda.Controller // nil: SIOC off
	HV              Hypervisor
	Stats           Stats
	// Domain names the libvirt domain of a policy VM; nil: the VM's name
	// (the lab's are sl-CLUSTER-VM).
	Domain func(vm string) string

	state State
	last  Output
	where map[string][2]string // VM/DISK → domain, target
	// originals: the throttle each disk had before sluice set one.
	originals map[string]Limits
}

// Last is the last period's output.
func (d *Driver) Last() Output { return d.last }

// Originals returns the throttle each disk had before sluice first set
// one, by VM/DISK (the agent keeps them across restarts).
func (d *Driver) Originals() map[string]Limits { return maps(d.originals) }

// SetOriginals restores what Originals returned before a restart.
func (d *Driver) SetOriginals(m map[string]Limits) { d.originals = maps(m) }

// Location returns the domain and target dev of a disk seen in the last
// period.
func (d *Driver) Location(name string) (vm, target string, ok bool) {
	w, ok := d.where[name]
	return w[0], w[1], ok
}

// Period runs one period ending at endNs (Unix ns) of length periodNs for
// the datastore's disks of this host, specs (R, S, L from the policy),
// with the period's probes of the datastore (nil: none).
// A throttle that failed to be set is tried again next period; the
// errors are joined, and the period's output is returned all the same.
func (d *Driver) Period(specs []entitle.DiskSpec, endNs, periodNs int64, probe *Probe) (Output, error) {
	var errs []error
	vms := make([]string, 0, len(specs))
	for _, s := range specs {
		if dom := d.domain(s.VM); !slices.Contains(vms, dom) {
			vms = append(vms, dom)
		}
	}
	disks, err := d.HV.BlockStats(vms)
	if err != nil {
		return d.last, fmt.Errorf("datastore %s: block stats: %w", d.Datastore, err)
	}
	ms, hs := Match(specs, disks, d.Domain)
	recs, err := d.Stats.Read()
	if err != nil {
		errs = append(errs, fmt.Errorf("datastore %s: read stats: %w", d.Datastore, err))
	}
	in := Input{Host: d.Host, EndNs: endNs, PeriodNs: periodNs, Recs: recs, Probe: probe}
	d.where = map[string][2]string{}
	for i, s := range ms {
		in.Disks = append(in.Disks, Disk{Spec: s, Counters: hs[i].Counters})
		d.where[s.Name] = [2]string{hs[i].VM, hs[i].Target}
	}
	out := Step(d.Ctl, d.state, in)
	if d.originals == nil {
		d.originals = map[string]Limits{}
	}
	for i := range out.Disks {
		r := &out.Disks[i]
		if !r.Change {
			continue
		}
		h := hs[i]
		if _, ok := d.originals[r.Name]; !ok {
			orig, err := d.HV.IOTune(h.VM, h.Target)
			if err != nil {
				errs = append(errs, fmt.Errorf("disk %s: read iotune of %s %s: %w", r.Name, h.VM, h.Target, err))
				d.forget(&out, r.Name)
				continue
			}
			d.originals[r.Name] = orig
		}
		if err := d.HV.SetIOTune(h.VM, h.Target, r.Throttle); err != nil {
			errs = append(errs, fmt.Errorf("disk %s: set iotune of %s %s: %w", r.Name, h.VM, h.Target, err))
			d.forget(&out, r.Name)
		}
	}
	if err := d.Stats.Write(out.Publish); err != nil {
		errs = append(errs, fmt.Errorf("datastore %s: write stats: %w", d.Datastore, err))
	}
	d.state, d.last = out.State, out
	return out, errors.Join(errs...)
}

func (d *Driver) domain(vm string) string {
	if d.Domain == nil {
		return vm
	}
	return d.Domain(vm)
}

// Reset forgets everything the driver learnt (counters, throttles set,
// originals): after an uninstall, its next period starts afresh.
func (d *Driver) Reset() {
	d.state, d.last, d.where, d.originals = State{}, Output{}, nil, nil
}

// forget marks a disk's throttle as not in QEMU, so that the next period
// sets it again.
func (d *Driver) forget(out *Output, name string) {
	ds := out.State.Disks[name]
	ds.Applied = false
	out.State.Disks[name] = ds
}

// Restore gives every disk sluice throttled back the throttle it had
// before, on the VMs' domains running now (a domain that stopped took its
// throttle with it: QEMU's throttle lives in the process). Disks given
// back are forgotten; the others are reported in the error.
func (d *Driver) Restore(vms []string) error {
	doms := make([]string, len(vms))
	for i, vm := range vms {
		doms[i] = d.domain(vm)
	}
	disks, err := d.HV.BlockStats(doms)
	if err != nil {
		return fmt.Errorf("datastore %s: block stats: %w", d.Datastore, err)
	}
	var errs []error
	names := make([]string, 0, len(d.originals))
	for n := range d.originals {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		vm, dk, _ := strings.Cut(name, "/")
		_, hs := Match([]entitle.DiskSpec{{Name: name, VM: vm, Disk: dk}}, disks, d.Domain)
		if len(hs) == 0 {
			delete(d.originals, name)
			continue
		}
		if err := d.HV.SetIOTune(hs[0].VM, hs[0].Target, d.originals[name]); err != nil {
			errs = append(errs, fmt.Errorf("disk %s: restore iotune of %s %s: %w", name, hs[0].VM, hs[0].Target, err))
			continue
		}
		delete(d.originals, name)
	}
	d.state = State{}
	return errors.Join(errs...)
}

func maps(m map[string]Limits) map[string]Limits {
	c := make(map[string]Limits, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
