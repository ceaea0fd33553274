package virt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"

	"sluice/agent"
)

// Config is what a libvirt host's inventory is told rather than asks.
type Config struct {
	// Uplinks maps the policy's uplink names to the host's own devices
	// (a NIC, a bond, a VLAN device): vmnic0 → bond0.
	Uplinks map[string]string
	// Addr is the host's own source address (agent.Inventory.HostAddr);
	// zero when host traffic is not classified.
	Addr netip.Addr
	// Cgroup resolves a running domain's cgroup directory; nil leaves
	// Domain.Cgroup empty. ProcCgroup reads it from the QEMU process.
	Cgroup func(d Domain) string
	// Master returns the bridge an uplink device is a port of ("" for
	// none): a vNIC of a domain the policy does not name counts only
	// when its traffic can leave through an uplink, i.e. it is on such a
	// bridge or is a macvtap on an uplink device (UnnamedVMs). Nil: every
	// such vNIC with a host-side device counts.
	Master func(dev string) (string, error)
	// Sysfs is where sysfs is mounted, for the SR-IOV VFs of passthrough
	// vNICs (VF); "": DefaultSysfs. Tests point it at a tree of their own.
	Sysfs string
}

// VNIC is a running domain's interface as a policy port sees it.
type VNIC struct {
	Port  string // VM/NIC, as the policy names it
	Index int    // stable while the domain runs, 0..agent.MaxVNICIndex
	Interface
}

// Match is how the agent recognises the vNIC's packets: its stable index
// and its host-side device (the tap or macvtap), where the agent puts its
// classifier.
func (v VNIC) Match() agent.VNICMatch {
	mac, _ := net.ParseMAC(v.MAC)
	return agent.VNICMatch{Index: v.Index, HostDev: v.Dev, MAC: mac}
}

// Inventory is the agent.Inventory of a libvirt host. Refresh reads every
// running domain; Run keeps it current from lifecycle events and signals
// each change on Changes. It is safe for concurrent use.
type Inventory struct {
	conn    Conn
	cfg     Config
	changes chan struct{}

	mu      sync.Mutex
	doms    map[string]*Domain // running domains by name
	index   map[string]int     // name|MAC → vNIC index, while the domain runs
	used    map[int]bool       // indexes in use
	policy  []string           // the policy's VM names (domain names or UUIDs); nil: all
	lastErr error
}

var (
	_ agent.Inventory       = (*Inventory)(nil)
	_ agent.CgroupInventory = (*Inventory)(nil)
	_ agent.UnnamedLister   = (*Inventory)(nil)
	_ agent.VFInventory     = (*Inventory)(nil)
)

// New returns an empty inventory over conn; call Refresh or Run.
func New(conn Conn, cfg Config) *Inventory {
	return &Inventory{conn: conn, cfg: cfg, changes: make(chan struct{}, 1),
		doms: map[string]*Domain{}, index: map[string]int{}, used: map[int]bool{}}
}

// Changes receives a value after each change of the running domains (at
// most one pending: changes coalesce). The agent re-derives on it.
func (inv *Inventory) Changes() <-chan struct{} { return inv.changes }

func (inv *Inventory) notify() {
	select {
	case inv.changes <- struct{}{}:
	default:
	}
}

// SetPolicyVMs tells the inventory how the policy names VMs: by domain
// name or by UUID. VMs then returns the policy's names of the running
// domains it names; Unnamed returns the others. Before it is called, VMs
// returns every running domain by name.
func (inv *Inventory) SetPolicyVMs(names []string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.policy = append([]string{}, names...) // never nil once set
}

// DomainsError is what Refresh returns when it listed the domains but
// could not read some of them: the others are in the inventory, and the
// agent goes on with them.
type DomainsError struct{ Err error }

func (e *DomainsError) Error() string { return e.Err.Error() }
func (e *DomainsError) Unwrap() error { return e.Err }

// Refresh reads every running domain anew (at start and after a lost
// connection); domains that no longer run are dropped. An error of the
// listing is returned as it is; errors of single domains come as one
// *DomainsError, after the domains that could be read are in.
func (inv *Inventory) Refresh() error {
	names, err := inv.conn.Running()
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var errs []error
	for _, n := range names {
		seen[n] = true
		if err := inv.update(n); err != nil {
			errs = append(errs, err)
		}
	}
	inv.mu.Lock()
	changed := false
	for n := range inv.doms {
		if !seen[n] {
			inv.dropLocked(n)
			changed = true
		}
	}
	inv.mu.Unlock()
	if changed {
		inv.notify()
	}
	if len(errs) > 0 {
		return &DomainsError{errors.Join(errs...)}
	}
	return nil
}

// update reads one domain's live XML: adds or replaces it when it runs,
// drops it when it does not.
func (inv *Inventory) update(name string) error {
	b, err := inv.conn.LiveXML(name)
	if errors.Is(err, ErrNotRunning) {
		inv.remove(name)
		return nil
	}
	if err != nil {
		return err
	}
	d, err := ParseDomainXML(b)
	if err != nil {
		return fmt.Errorf("domain %s: %w", name, err)
	}
	if inv.cfg.Cgroup != nil {
		d.Cgroup = inv.cfg.Cgroup(d)
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	old := inv.doms[name]
	// Indexes: kept for interfaces seen before, released for interfaces
	// that went away (hot unplug), the lowest free one for new ones.
	keep := map[string]bool{}
	for _, i := range d.Interfaces {
		keep[name+"|"+i.MAC] = true
	}
	if old != nil {
		for _, i := range old.Interfaces {
			if k := name + "|" + i.MAC; !keep[k] {
				delete(inv.used, inv.index[k])
				delete(inv.index, k)
			}
		}
	}
	var full error
	for _, i := range d.Interfaces {
		k := name + "|" + i.MAC
		if _, ok := inv.index[k]; ok {
			continue
		}
		idx := 0
		for inv.used[idx] {
			idx++
		}
		if idx > agent.MaxVNICIndex {
			full = fmt.Errorf("domain %s: more than %d vNICs on the host; %s has none", name, agent.MaxVNICIndex+1, i.MAC)
			continue
		}
		inv.index[k] = idx
		inv.used[idx] = true
	}
	inv.doms[name] = &d
	if old == nil || !sameDomain(*old, d) {
		inv.notify()
	}
	return full
}

func sameDomain(a, b Domain) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func (inv *Inventory) remove(name string) {
	inv.mu.Lock()
	_, ok := inv.doms[name]
	inv.dropLocked(name)
	inv.mu.Unlock()
	if ok {
		inv.notify()
	}
}

func (inv *Inventory) dropLocked(name string) {
	d := inv.doms[name]
	if d == nil {
		return
	}
	for _, i := range d.Interfaces {
		k := name + "|" + i.MAC
		if idx, ok := inv.index[k]; ok {
			delete(inv.used, idx)
			delete(inv.index, k)
		}
	}
	delete(inv.doms, name)
}

// Handle applies one lifecycle event: a started or migrated-in domain is
// read, a stopped or migrated-out one dropped, any other event re-reads
// the domain (it may have stopped meanwhile).
func (inv *Inventory) Handle(ev Event) error {
	switch ev.Kind {
	case EventStopped, EventMigratedOut:
		inv.remove(ev.Domain)
		return nil
	}
	return inv.update(ev.Domain)
}

// Run subscribes to lifecycle events, reads every running domain, then
// applies each event as it comes, until ctx ends (nil) or the event stream
// is lost (an error; the caller reconnects and runs again). Errors of
// single domains are reported through LastErr and do not stop it.
func (inv *Inventory) Run(ctx context.Context) error {
	evs, err := inv.conn.Lifecycle(ctx)
	if err != nil {
		return err
	}
	// Subscribed first, read second: a domain that starts in between is
	// in the listing, its event, or both (applying both is harmless).
	inv.setErr(inv.Refresh())
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-evs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("libvirt: lifecycle event stream closed")
			}
			inv.setErr(inv.Handle(ev))
		}
	}
}

func (inv *Inventory) setErr(err error) {
	if err == nil {
		return
	}
	inv.mu.Lock()
	inv.lastErr = err
	inv.mu.Unlock()
}

// LastErr returns the last error that Run met reading a domain, if any.
func (inv *Inventory) LastErr() error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.lastErr
}

// Domains returns the running domains, sorted by name.
func (inv *Inventory) Domains() []Domain {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make([]Domain, 0, len(inv.doms))
	for _, d := range inv.doms {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// lookupLocked finds a running domain by name or UUID.
func (inv *Inventory) lookupLocked(vm string) *Domain {
	if d := inv.doms[vm]; d != nil {
		return d
	}
	u := strings.ToLower(vm)
	for _, d := range inv.doms {
		if d.UUID != "" && d.UUID == u {
			return d
		}
	}
	return nil
}

// VMs returns the policy's names of the running domains it names (see
// SetPolicyVMs), or every running domain's name before SetPolicyVMs.
func (inv *Inventory) VMs() ([]string, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var out []string
	if inv.policy == nil {
		for n := range inv.doms {
			out = append(out, n)
		}
	} else {
		for _, n := range inv.policy {
			if inv.lookupLocked(n) != nil {
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// Unnamed returns the names of the running domains that the policy names
// neither by name nor by UUID (all of them before SetPolicyVMs). The
// derivation gives their vNICs the policy's unnamedVMs (UnnamedVMs).
func (inv *Inventory) Unnamed() []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	named := map[*Domain]bool{}
	for _, n := range inv.policy {
		if d := inv.lookupLocked(n); d != nil {
			named[d] = true
		}
	}
	var out []string
	for n, d := range inv.doms {
		if !named[d] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// UUIDs returns the UUID of each running domain, by domain name.
func (inv *Inventory) UUIDs() map[string]string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make(map[string]string, len(inv.doms))
	for n, d := range inv.doms {
		if d.UUID != "" {
			out[n] = d.UUID
		}
	}
	return out
}

// UnnamedVMs returns the running domains that the policy does not name
// (Unnamed), each with its interfaces that have a host-side device (the
// agent classifies there), an index, and a way out through an uplink
// (Config.Master: on an uplink's bridge, or a macvtap on an uplink device;
// a domain on an isolated bridge sends nothing through the uplinks). They
// are named so that Port finds them: the user alias without ua-, else nicK
// when no interface of the domain has a ua- alias, else the device (the
// MAC when that would find another interface). A domain with no such
// interface is listed without vNICs.
func (inv *Inventory) UnnamedVMs() []agent.UnnamedVM {
	names := inv.Unnamed()
	out := inv.uplinkPorts()
	inv.mu.Lock()
	defer inv.mu.Unlock()
	vms := make([]agent.UnnamedVM, 0, len(names))
	for _, n := range names {
		d := inv.doms[n]
		if d == nil {
			continue
		}
		vm := agent.UnnamedVM{Name: n}
		for i, f := range d.Interfaces {
			if _, ok := inv.index[n+"|"+f.MAC]; !ok || f.Dev == "" {
				continue
			}
			if out != nil && !(f.Bridge != "" && out.bridges[f.Bridge] || f.Type == "direct" && out.devs[f.Source]) {
				continue
			}
			vm.NICs = append(vm.NICs, nicName(d.Interfaces, i))
		}
		vms = append(vms, vm)
	}
	return vms
}

// exits are the uplink devices and the bridges they are ports of.
type exits struct {
	devs, bridges map[string]bool
}

// uplinkPorts reads the bridges of the uplink devices (Config.Master);
// nil without Master. An uplink whose master cannot be read has none.
func (inv *Inventory) uplinkPorts() *exits {
	if inv.cfg.Master == nil {
		return nil
	}
	e := &exits{devs: map[string]bool{}, bridges: map[string]bool{}}
	for _, d := range inv.cfg.Uplinks {
		e.devs[d] = true
		if m, err := inv.cfg.Master(d); err == nil && m != "" {
			e.bridges[m] = true
		}
	}
	return e
}

// nicName names the i-th interface so that matchNIC finds it again.
func nicName(ifs []Interface, i int) string {
	aliased := false
	for _, f := range ifs {
		aliased = aliased || strings.HasPrefix(f.Alias, "ua-")
	}
	f := ifs[i]
	name := f.Dev
	switch {
	case strings.HasPrefix(f.Alias, "ua-") && len(f.Alias) > 3:
		name = f.Alias[3:]
	case !aliased:
		name = "nic" + strconv.Itoa(i)
	}
	if k, ok := matchNIC(ifs, name); ok && k == i {
		return name
	}
	return f.MAC
}

// VMCgroup returns the cgroup of the running domain vm (by name or UUID)
// relative to the root of its hierarchy, as the agent's cpuctl.Cgroups
// want it: Domain.Cgroup without its mount point (CgroupMounts). ok is
// false when the domain does not run or its cgroup is unknown.
func (inv *Inventory) VMCgroup(vm string) (string, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	d := inv.lookupLocked(vm)
	if d == nil || d.Cgroup == "" {
		return "", false
	}
	g := relCgroup(d.Cgroup)
	return g, g != ""
}

// CgroupMounts are where ProcCgroup's directories are mounted, longest
// first: the v1 cpu controller, the hybrid layout's unified hierarchy,
// and cgroup2 at its usual place.
var CgroupMounts = []string{"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"}

// relCgroup strips the mount point from an absolute cgroup directory; a
// relative one is returned as it is.
func relCgroup(dir string) string {
	if !strings.HasPrefix(dir, "/") {
		return dir
	}
	for _, m := range CgroupMounts {
		if r, ok := strings.CutPrefix(dir, m+"/"); ok {
			return r
		}
	}
	return ""
}

// UplinkDevice returns the configured device of the uplink.
func (inv *Inventory) UplinkDevice(uplink string) (string, error) {
	if d, ok := inv.cfg.Uplinks[uplink]; ok && d != "" {
		return d, nil
	}
	return "", fmt.Errorf("no device configured for uplink %q (--uplink %s=DEVICE)", uplink, uplink)
}

// HostAddr returns the configured host address.
func (inv *Inventory) HostAddr() netip.Addr { return inv.cfg.Addr }

// VNIC returns the vNIC's match (see Port).
func (inv *Inventory) VNIC(port string) (agent.VNICMatch, bool) {
	v, ok := inv.Port(port)
	return v.Match(), ok
}

// Port finds the interface of the port VM/NIC. VM is the domain's name or
// UUID. NIC is matched against the domain's interfaces in this order:
//  1. the user alias: <alias name='ua-NIC'/>;
//  2. the host-side device (target dev, e.g. vnet3);
//  3. the MAC address;
//  4. nicK (or netK): the K-th interface in the domain's XML, counted
//     from 0, when no interface carries a ua- alias.
//
// ok is false when the domain does not run or has no such interface.
func (inv *Inventory) Port(port string) (VNIC, bool) {
	vm, nic, found := strings.Cut(port, "/")
	if !found || vm == "" || nic == "" {
		return VNIC{}, false
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	d := inv.lookupLocked(vm)
	if d == nil {
		return VNIC{}, false
	}
	i, ok := matchNIC(d.Interfaces, nic)
	if !ok {
		return VNIC{}, false
	}
	iface := d.Interfaces[i]
	idx, ok := inv.index[d.Name+"|"+iface.MAC]
	if !ok {
		return VNIC{}, false // no index left for it
	}
	return VNIC{Port: port, Index: idx, Interface: iface}, true
}

func matchNIC(ifs []Interface, nic string) (int, bool) {
	aliased := false
	for i, f := range ifs {
		if f.Alias == "ua-"+nic {
			return i, true
		}
		aliased = aliased || strings.HasPrefix(f.Alias, "ua-")
	}
	for i, f := range ifs {
		if f.Dev != "" && f.Dev == nic {
			return i, true
		}
	}
	for i, f := range ifs {
		if strings.EqualFold(f.MAC, nic) {
			return i, true
		}
	}
	if aliased {
		return 0, false
	}
	for _, p := range []string{"nic", "net"} {
		if s, ok := strings.CutPrefix(nic, p); ok {
			if k, err := strconv.Atoi(s); err == nil && k >= 0 && k < len(ifs) && strconv.Itoa(k) == s {
				return k, true
			}
		}
	}
	return 0, false
}
