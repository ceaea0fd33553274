package agent

import (
	"github.com/vishvananda/netlink"

	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// Record is what the agent changed on its host, kept in a state file next
// to the statistics file (RecordPath) and written before each change it
// describes, so that Uninstall can give the host back what was taken,
// also after a crash.
type Record struct {
	Cluster string `json:"cluster"`
	Host    string `json:"host"`
	// Uplinks maps each uplink device to the root qdisc sluice replaced.
	Uplinks map[string]Qdisc `json:"uplinks"`
	// VNICs are the host-side devices sluice put a classifier on.
	VNICs []string `json:"vnics"`
	// Ingress maps each IFB device sluice created to the uplink device
	// whose ingress it redirected there (inbound shaping).
	Ingress map[string]string `json:"ingress,omitempty"`
}

// RecordPath is the state file of an agent.
func RecordPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("agent-%s-%s.state.json", cluster, host))
}

// ReadRecord reads a state file; a missing file is an empty record.
func ReadRecord(path string) (*Record, error) {
	r := &Record{Uplinks: map[string]Qdisc{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Uplinks == nil {
		r.Uplinks = map[string]Qdisc{}
	}
	return r, nil
}

// WriteRecord writes a state file atomically.
func WriteRecord(path string, r *Record) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// saveRecord persists the record when the agent has a state file.
func (a *Agent) saveRecord() error {
	if a.cfg.RecordPath == "" {
		return nil
	}
	if err := WriteRecord(a.cfg.RecordPath, a.rec); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// takeUplink checks, once per agent, that dev may be shaped and records
// its root qdisc before sluice's first change: an uplink enslaved to Open
// vSwitch is refused, and so is a root sluice could not give back. The
// root goes into the state file and into the roots directory. A root
// that already is sluice's HTB (a state file lost, another --state-dir) is
// taken from the roots directory, or else recorded as the kernel's
// default.
func (a *Agent) takeUplink(dev string) error {
	if a.taken[dev] {
		return nil
	}
	k := a.cfg.Kernel
	master, err := k.MasterKind(dev)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", dev, err)
	}
	if master == "openvswitch" {
		return fmt.Errorf("uplink %s is a port of an Open vSwitch bridge: sluice does not shape OVS uplinks (use OVS's own QoS, or a Linux bridge or bond)", dev)
	}
	if _, ok := a.rec.Uplinks[dev]; !ok {
		q, err := k.RootQdisc(dev)
		if err != nil {
			return fmt.Errorf("QdiscList %s: %w", dev, err)
		}
		if q.IsSluice() {
			kept, ok, err := readRootRecord(a.cfg.RootsDir, q)
			if err != nil {
				return fmt.Errorf("uplink %s: %w", dev, err)
			}
			if !ok {
				kept = Qdisc{Kind: "noqueue", Handle: "0:0", Default: true, Device: q.Device}
			}
			q = kept
		} else if err := CheckRestorable(q); err != nil {
			return fmt.Errorf("uplink %s: %w", dev, err)
		}
		if err := writeRootRecord(a.cfg.RootsDir, q); err != nil {
			return fmt.Errorf("uplink %s: %w", dev, err)
		}
		a.rec.Uplinks[dev] = q
		if err := a.saveRecord(); err != nil {
			return err
		}
	}
	a.taken[dev] = true
	return nil
}

// VNICGoneGraceNs is how long a vNIC device may be missing before the
// agent reports it (the inventory drops a stopped VM within it).
const VNICGoneGraceNs = int64(2e9)

// isNoDevice tells an error of a device that does not exist.
func isNoDevice(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, errFakeNoLink)
}

// reconcileVNICs puts the vNIC classifiers of the trees whose uplink is
// ready in place (read, compare, replace), recording each device before
// its first change, and removes the classifiers of recorded devices no
// tree wants any more.
//
// A vNIC device that does not exist is reported only once it has been
// missing for VNICGoneGraceNs: a stopped VM's tap goes a moment before the
// inventory says the VM stopped.
func (a *Agent) reconcileVNICs(nowNs int64, ready map[string]bool, ch *Changes) error {
	k := a.cfg.Kernel
	var errs []error
	want := map[string]bool{}
	for _, t := range a.trees {
		for _, v := range t.VNICs {
			want[v.Dev] = true
			if !ready[t.Dev] {
				continue
			}
			class, ok, err := k.VNICClass(v.Dev)
			if err != nil && isNoDevice(err) {
				since, seen := a.vnicMissing[v.Dev]
				if !seen {
					a.vnicMissing[v.Dev], since = nowNs, nowNs
				}
				if nowNs-since >= VNICGoneGraceNs {
					errs = append(errs, fmt.Errorf("VNICClass %s: %w (for %.1f s)", v.Dev, err, float64(nowNs-since)/1e9))
				}
				continue
			}
			delete(a.vnicMissing, v.Dev)
			if err != nil {
				errs = append(errs, fmt.Errorf("VNICClass %s: %w", v.Dev, err))
				continue
			}
			if ok && class == v.Class {
				continue
			}
			if !slices.Contains(a.rec.VNICs, v.Dev) {
				a.rec.VNICs = append(a.rec.VNICs, v.Dev)
				sort.Strings(a.rec.VNICs)
				if err := a.saveRecord(); err != nil {
					return err
				}
			}
			if err := k.SetVNICClass(v.Dev, v.Class); err != nil {
				errs = append(errs, fmt.Errorf("SetVNICClass %s %s: %w", v.Dev, v.Class, err))
				continue
			}
			ch.VNICsSet++
		}
	}
	for dev := range a.vnicMissing {
		if !want[dev] {
			delete(a.vnicMissing, dev)
		}
	}
	var keep []string
	for _, dev := range a.rec.VNICs {
		if want[dev] {
			keep = append(keep, dev)
			continue
		}
		if err := k.ClearVNICClass(dev); err != nil {
			errs = append(errs, fmt.Errorf("ClearVNICClass %s: %w", dev, err))
			keep = append(keep, dev)
			continue
		}
		ch.VNICsCleared++
	}
	if len(keep) != len(a.rec.VNICs) {
		a.rec.VNICs = keep
		errs = append(errs, a.saveRecord())
	}
	return errors.Join(errs...)
}

// UninstallOptions say where else Uninstall may find what was replaced.
type UninstallOptions struct {
	// RootsDir is the agents' roots directory (DefaultRootsDir): the root
	// of an uplink the state file does not name is looked up there.
	RootsDir string
	// KernelDefault gives an uplink whose replaced root is recorded
	// nowhere the kernel's default (sluice's root deleted); without it
	// such an uplink is an error.
	KernelDefault bool
}

// ErrRootUnknown is the error of an uplink where sluice's HTB is the root
// but the root it replaced is recorded nowhere.
var ErrRootUnknown = errors.New("the root qdisc sluice replaced is recorded neither in the state file nor in the roots directory")

// Uninstall gives the host back what sluice took: on every uplink of rec
// whose root is still sluice's HTB, the recorded root qdisc (with it go
// sluice's classes and u32 filters); on every vNIC device of rec, sluice's
// classifier and the clsact qdisc when nothing else is on it. uplinks and
// vnics (the inventory's devices) are cleaned too when rec does not name
// them (a lost state file): an uplink's root comes from o.RootsDir, or is
// the kernel's default with o.KernelDefault, or else is an error
// (ErrRootUnknown) and sluice's HTB stays. Devices that are gone are
// skipped. It returns what it did, one line per device; running it again
// does nothing.
func Uninstall(k Kernel, rec *Record, o UninstallOptions, uplinks, vnics []string) ([]string, error) {
	var done []string
	var errs []error
	devs := map[string]*Qdisc{}
	for _, d := range uplinks {
		devs[d] = nil
	}
	if rec != nil {
		for d, q := range rec.Uplinks {
			devs[d] = &q
		}
		vnics = append(append([]string(nil), vnics...), rec.VNICs...)
	}
	var names []string
	for d := range devs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		cur, err := k.RootQdisc(d)
		if err != nil {
			done = append(done, fmt.Sprintf("%s: not found, skipped (%v)", d, err))
			continue
		}
		if !cur.IsSluice() {
			continue // given back already, or someone else's since
		}
		var q Qdisc
		switch kept, ok, err := readRootRecord(o.RootsDir, cur); {
		case devs[d] != nil:
			q = *devs[d]
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", d, err))
			continue
		case ok:
			q = kept
		case o.KernelDefault:
			q = Qdisc{Kind: "noqueue", Handle: "0:0", Default: true}
		default:
			errs = append(errs, fmt.Errorf("uplink %s: %w", d, ErrRootUnknown))
			continue
		}
		if err := k.RestoreRoot(d, q); err != nil {
			errs = append(errs, fmt.Errorf("restoring the root qdisc of %s (%s %s): %w", d, q.Kind, q.Handle, err))
			continue
		}
		if err := removeRootRecord(o.RootsDir, cur); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d, err))
		}
		how := "given back"
		if q.Default {
			how = "the kernel's default"
		}
		done = append(done, fmt.Sprintf("%s: root qdisc %s %s (%s) restored, sluice's HTB classes and filters removed", d, q.Kind, q.Handle, how))
	}
	in, err := uninstallIngress(k, rec, uplinks)
	done = append(done, in...)
	errs = append(errs, err)
	sort.Strings(vnics)
	for _, d := range slices.Compact(vnics) {
		class, ok, _ := k.VNICClass(d)
		// Cleared even when VNICClass does not recognise the program (an
		// older sluice's): the filter is known by its name.
		if err := k.ClearVNICClass(d); err != nil {
			errs = append(errs, fmt.Errorf("ClearVNICClass %s: %w", d, err))
			continue
		}
		if ok {
			done = append(done, fmt.Sprintf("%s: classifier (priority %s) removed", d, class))
		}
	}
	return done, errors.Join(errs...)
}
