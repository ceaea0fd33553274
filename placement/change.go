package placement

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"sluice/feasible"
	"sluice/policy"
)

// A change is a reconfiguration given on the command line as
// TARGET.FIELD[=VALUE]:
//
//	VM.host=HOST                 migrate VM to HOST by hand ("VM.host=": placement chooses)
//	VM.memory=SIZE               e.g. 8GiB
//	VM.vcpus=N
//	VM.cpu.reservation=MHZ       e.g. 2000MHz or 2000
//	VM.cpu.shares=low|normal|high|N   a keyword counts per vCPU
//	VM.cpu.limit=MHZ             0 or "unlimited" for none
//	VM.migratable=true|false
//	VM/NIC.reservation=RATE      e.g. 4.5Gbps
//	VM/NIC.limit=RATE|unlimited
//	VM/NIC.shares=low|normal|high|N
//	VM/NIC.uplink=UPLINK         pin to an uplink ("" unpins)
//	VM/DISK.reservation=IOPS     e.g. 500 (a disk is told from a NIC by name)
//	VM/DISK.shares=low|normal|high|N
//	VM/DISK.limit=IOPS|unlimited
//	HOST/UPLINK.down             the uplink is lost
//	HOST.memory=SIZE, HOST.cores=N, HOST.mhz=N
//
// ParseChange checks the syntax; Change.Apply checks the names and values.

// Change is one parsed change.
type Change struct {
	Spec   string // as given
	Target string // VM or HOST
	Sub    string // NIC, DISK or UPLINK; "" for the VM or host itself
	Field  string // e.g. "reservation", "cpu.reservation", "down"
	Value  string
	// HasValue is false for "HOST/UPLINK.down".
	HasValue bool
}

// ErrUsage marks a change that does not parse (exit 2 in the CLI).
var ErrUsage = errors.New("usage")

// RefusedError is a change that breaks a cluster-wide admission rule
// (DESIGN.md §2): it is refused and nothing changes.
type RefusedError struct {
	Spec, Reason string
}

// Error renders the refusal as one line.
func (e *RefusedError) Error() string { return fmt.Sprintf("change %q refused: %s", e.Spec, e.Reason) }

// ParseChange parses TARGET[/SUB].FIELD[=VALUE]. Its errors wrap ErrUsage.
func ParseChange(spec string) (Change, error) {
	c := Change{Spec: spec}
	if i := strings.IndexFunc(spec, unicode.IsControl); i >= 0 {
		return c, fmt.Errorf("%w: change %q: control character at byte %d", ErrUsage, spec, i)
	}
	lhs := spec
	if i := strings.IndexByte(spec, '='); i >= 0 {
		lhs, c.Value, c.HasValue = spec[:i], spec[i+1:], true
	}
	dot := strings.IndexByte(lhs, '.')
	if dot <= 0 || dot == len(lhs)-1 {
		return c, fmt.Errorf("%w: change %q: want TARGET.FIELD=VALUE (e.g. vm2/nic0.reservation=4.5Gbps, vm1.host=h2, h1/vmnic0.down)", ErrUsage, spec)
	}
	c.Target, c.Field = lhs[:dot], lhs[dot+1:]
	if i := strings.IndexByte(c.Target, '/'); i >= 0 {
		c.Target, c.Sub = c.Target[:i], c.Target[i+1:]
		if c.Target == "" || c.Sub == "" || strings.Contains(c.Sub, "/") {
			return c, fmt.Errorf("%w: change %q: target must be NAME or NAME/PART", ErrUsage, spec)
		}
	}
	if c.Field == "down" {
		if c.HasValue || c.Sub == "" {
			return c, fmt.Errorf("%w: change %q: write HOST/UPLINK.down, without a value", ErrUsage, spec)
		}
	} else if !c.HasValue {
		return c, fmt.Errorf("%w: change %q: missing =VALUE", ErrUsage, spec)
	}
	return c, nil
}

// Apply returns a copy of p with the change made, and the placement after
// it (cur, or the hosts p gives when cur is nil; a copy). It returns an
// error naming the problem for an unknown name or a bad value, and a
// *RefusedError when the change breaks a rule no migration can mend (R > L,
// a pool quota or a datastore's IOPS exceeded, a vNIC reservation larger
// than any uplink can hold). Neither p nor cur is modified; the policy
// returned shares with p what the change does not touch (a host's
// uplinks, a VM's NICs and disks), so that both are read, not edited.
func (c Change) Apply(p *policy.Policy, cur Placement) (*policy.Policy, Placement, error) {
	np, err := c.Policy(p, cur)
	if err != nil {
		return nil, nil, err
	}
	return np, placed(np, cur, c), nil
}

// Policy is Apply without the placement after the change: the policy with
// the change made, or the same error.
func (c Change) Policy(p *policy.Policy, cur Placement) (*policy.Policy, error) {
	np := clonePolicy(p)
	if err := c.apply(np); err != nil {
		return nil, fmt.Errorf("change %q: %v", c.Spec, err)
	}
	// The checks read the VMs' hosts from cur (nil: each policy's own),
	// which places np's VMs as p's but for a migration; they ignore the
	// VMs and hosts a policy does not name, and a VM mapped to "".
	after := cur
	if cur != nil && c.moves() {
		after = placed(np, cur, c)
	}
	if reason := refusal(p, cur, np, after, c); reason != "" {
		return nil, &RefusedError{Spec: c.Spec, Reason: reason}
	}
	return np, nil
}

// moves reports a migration by hand, VM.host=HOST (or VM.host=: off).
func (c Change) moves() bool { return c.Sub == "" && c.Field == "host" }

// placed is the placement after c, made into np, of the VMs placed as cur
// (nil: the hosts np gives): each VM of np with a host, the VM that c
// migrates on its new one.
func placed(np *policy.Policy, cur Placement, c Change) Placement {
	pl := make(Placement, len(np.VMs))
	for _, v := range np.VMs {
		h := v.Host
		if cur != nil && !(c.moves() && v.Name == c.Target) {
			h = cur[v.Name]
		}
		if h != "" {
			pl[v.Name] = h
		}
	}
	return pl
}

// Hosts names the hosts whose own faults (Check's decisions with a Host)
// the change can alter, made on p with the VMs placed as cur (nil: the
// hosts p gives): a host it targets, else the host the VM it targets is
// placed on and, for a migration, the host it moves to. Every other host
// keeps its faults, with the placement kept or as Apply returns it, so
// that CheckHosts on these hosts finds every fault the change brings.
func (c Change) Hosts(p *policy.Policy, cur Placement) []string {
	if p.Host(c.Target) != nil {
		return []string{c.Target}
	}
	v := p.VM(c.Target)
	if v == nil {
		return nil
	}
	var hs []string
	if h := hostIn(cur, v); h != "" {
		hs = append(hs, h)
	}
	if c.moves() && c.Value != "" {
		hs = append(hs, c.Value)
	}
	return hs
}

// hostIn is the host v is placed on in cur (nil: the host of the policy).
func hostIn(cur Placement, v *policy.VM) string {
	if cur == nil {
		return v.Host
	}
	return cur[v.Name]
}

// VM returns the name of the VM the change concerns, or "".
func (c Change) VM(p *policy.Policy) string {
	if p.VM(c.Target) != nil {
		return c.Target
	}
	return ""
}

func (c Change) apply(p *policy.Policy) error {
	if h := p.Host(c.Target); h != nil {
		return c.applyHost(p, h)
	}
	v := p.VM(c.Target)
	if v == nil {
		return fmt.Errorf("no VM or host %q", c.Target)
	}
	if c.Sub != "" {
		for i := range v.NICs {
			if v.NICs[i].Name == c.Sub {
				v.NICs = slices.Clone(v.NICs) // shared with p until now (clonePolicy)
				return c.applyNIC(&v.NICs[i])
			}
		}
		for i := range v.Disks {
			if v.Disks[i].Name == c.Sub {
				v.Disks = slices.Clone(v.Disks)
				return c.applyDisk(&v.Disks[i])
			}
		}
		return fmt.Errorf("VM %s has no NIC or disk %q", v.Name, c.Sub)
	}
	switch c.Field {
	case "host":
		if c.Value != "" && p.Host(c.Value) == nil {
			return fmt.Errorf("no host %q", c.Value)
		}
		v.Host = c.Value
	case "memory":
		b, err := policy.ParseSize(c.Value)
		if err != nil {
			return err
		}
		v.Memory = b
	case "vcpus":
		n, err := positive(c.Value)
		if err != nil {
			return err
		}
		v.CPU.VCPUs = n
	case "cpu.reservation":
		n, err := mhz(c.Value, false)
		if err != nil {
			return err
		}
		v.CPU.ReservationMHz = n
	case "cpu.limit":
		n, err := mhz(c.Value, true)
		if err != nil {
			return err
		}
		v.CPU.LimitMHz = n
	case "cpu.shares":
		n, err := policy.ParseShares(c.Value, "cpu", v.CPU.VCPUs)
		if err != nil {
			return fmt.Errorf("cpu.shares: %v", err)
		}
		v.CPU.Shares = n
	case "migratable":
		b, err := strconv.ParseBool(c.Value)
		if err != nil {
			return fmt.Errorf("migratable: want true or false, not %q", c.Value)
		}
		v.Migratable = b
	default:
		return fmt.Errorf("unknown VM field %q (host, memory, vcpus, cpu.reservation, cpu.shares, cpu.limit, migratable)", c.Field)
	}
	return nil
}

func (c Change) applyHost(p *policy.Policy, h *policy.Host) error {
	if c.Sub != "" {
		for i := range h.Uplinks {
			if h.Uplinks[i].Name == c.Sub {
				if c.Field != "down" {
					return fmt.Errorf("unknown uplink field %q (down)", c.Field)
				}
				h.Uplinks = append(h.Uplinks[:i:i], h.Uplinks[i+1:]...) // a new list
				return nil
			}
		}
		return fmt.Errorf("host %s has no uplink %q", h.Name, c.Sub)
	}
	switch c.Field {
	case "memory":
		b, err := policy.ParseSize(c.Value)
		if err != nil {
			return err
		}
		h.Memory = b
	case "cores":
		n, err := positive(c.Value)
		if err != nil {
			return err
		}
		h.CPU.Cores = n
	case "mhz":
		n, err := mhz(c.Value, false)
		if err != nil {
			return err
		}
		h.CPU.MHz = n
	default:
		return fmt.Errorf("unknown host field %q (memory, cores, mhz, or HOST/UPLINK.down)", c.Field)
	}
	return nil
}

func (c Change) applyNIC(n *policy.NIC) error {
	switch c.Field {
	case "reservation", "limit", "shares":
		return c.applyRate(c.Field, &n.Reservation, &n.Limit, &n.Shares)
	case "ingress.reservation", "ingress.limit", "ingress.shares":
		// A copy: the policy the change was made from keeps its setting.
		in := policy.Ingress{Shares: policy.NetSharesNormal, Limit: policy.Unlimited}
		if n.Ingress != nil {
			in = *n.Ingress
		}
		if err := c.applyRate(strings.TrimPrefix(c.Field, "ingress."), &in.Reservation, &in.Limit, &in.Shares); err != nil {
			return err
		}
		n.Ingress = &in
	case "uplink":
		n.Uplink = c.Value
	default:
		return fmt.Errorf("unknown NIC field %q (reservation, limit, shares, uplink, ingress.reservation, ingress.limit, ingress.shares)", c.Field)
	}
	return nil
}

// applyRate sets the reservation, limit or shares (field) of a vNIC's
// setting in one direction.
func (c Change) applyRate(field string, r, l *policy.Bps, shares *int) error {
	switch field {
	case "reservation":
		v, err := policy.ParseRate(c.Value)
		if err != nil {
			return err
		}
		*r = v
	case "limit":
		if c.Value == "unlimited" {
			*l = policy.Unlimited
			return nil
		}
		v, err := policy.ParseRate(c.Value)
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("limit: %s", policy.ZeroLimitMessage)
		}
		*l = v
	case "shares":
		k, err := policy.ParseShares(c.Value, "network", 1)
		if err != nil {
			return fmt.Errorf("shares: %v", err)
		}
		*shares = k
	}
	return nil
}

func (c Change) applyDisk(d *policy.Disk) error {
	if c.Field == "shares" {
		n, err := policy.ParseShares(c.Value, "storage", 1)
		if err != nil {
			return fmt.Errorf("shares: %v", err)
		}
		d.Shares = n
		return nil
	}
	var v policy.IOPS
	if c.Value == "unlimited" {
		if c.Field != "limit" {
			return fmt.Errorf("%s: unlimited is only for limit", c.Field)
		}
		v = policy.UnlimitedIOPS
	} else {
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(c.Value), "IOPS"), 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%s: want a number of IOPS, not %q", c.Field, c.Value)
		}
		v = policy.IOPS(n)
	}
	switch c.Field {
	case "reservation":
		d.ReservationIOPS = v
	case "limit":
		if v == 0 {
			return fmt.Errorf("limit: %s", policy.ZeroLimitMessage)
		}
		d.LimitIOPS = v
	default:
		return fmt.Errorf("unknown disk field %q (reservation, shares, limit)", c.Field)
	}
	return nil
}

func positive(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive integer, not %q", s)
	}
	return n, nil
}

// mhz parses "2000" or "2000MHz" (or "2.6GHz"); with unlimitedOK,
// "unlimited" is 0.
func mhz(s string, unlimitedOK bool) (int, error) {
	if unlimitedOK && s == "unlimited" {
		return 0, nil
	}
	mult := 1.0
	t := s
	switch {
	case strings.HasSuffix(t, "GHz"):
		t, mult = strings.TrimSuffix(t, "GHz"), 1000
	case strings.HasSuffix(t, "MHz"):
		t = strings.TrimSuffix(t, "MHz")
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f > 1e9 {
		return 0, fmt.Errorf("want a frequency such as 2000MHz, not %q", s)
	}
	n := int(f*mult + 0.5)
	if unlimitedOK && n == 0 {
		return 0, fmt.Errorf("%s", policy.ZeroLimitMessage)
	}
	return n, nil
}

// refusal says why the changed policy np breaks a rule that no migration
// can mend and that the old policy p did not break, or "". old places p's
// VMs (nil: the hosts p gives), pl np's.
func refusal(p *policy.Policy, old Placement, np *policy.Policy, pl Placement, c Change) string {
	if v := np.VM(c.Target); v != nil {
		if why := settingRefusal(v); why != "" {
			return why
		}
		// A vNIC reservation must fit on one uplink of some host: how
		// much room a host has depends on its uplinks, not its VMs.
		var fhs []feasible.Host
		if len(v.NICs) > 0 {
			fhs = make([]feasible.Host, len(np.Hosts))
			for hi := range np.Hosts {
				fhs[hi] = np.FeasibleHost(&np.Hosts[hi], nil)
			}
		}
		for _, n := range v.NICs {
			var best, bestIn int64
			for hi := range fhs {
				best = max(best, feasible.Room(&fhs[hi], n.Uplink))
				bestIn = max(bestIn, feasible.InRoom(&fhs[hi], n.Uplink))
			}
			if int64(n.Reservation) > best {
				return fmt.Sprintf("%s reservation %s fits on no uplink of any host (largest vm budget %s)",
					policy.PortName(v.Name, n.Name), fmtRate(float64(n.Reservation)), fmtRate(float64(best)))
			}
			if r := int64(n.Ingress.ReservationBps()); r > bestIn {
				return fmt.Sprintf("%s ingress reservation %s fits on no uplink of any host (largest inbound vm budget %s)",
					policy.PortName(v.Name, n.Name), fmtRate(float64(r)), fmtRate(float64(bestIn)))
			}
		}
	}
	if c.moves() && c.Value != "" && hostIn(old, p.VM(c.Target)) != c.Value {
		// A migration by hand must land where the VM fits: the VM is
		// judged against the destination's other VMs.
		s := newScopedState(np, pl, &Options{}, hostScope(np, c.Value))
		vi, hi := s.vmIdx[c.Target], s.hostIdx[c.Value]
		s.detach(vi)
		if !s.fits(vi, hi) {
			return fmt.Sprintf("%s does not fit on %s: %s", c.Target, c.Value, strings.Join(s.shortfalls(vi, hi), "; "))
		}
	}
	if isUplinkChange(c) {
		return ""
	}
	// Cluster-wide faults (Check's decisions without a host) that the
	// change brings: only the quotas need the VMs.
	before := map[string]bool{}
	for _, d := range newScopedState(p, old, &Options{}, nil).clusterFaults() {
		before[d.Why] = true
	}
	for _, d := range newScopedState(np, pl, &Options{}, nil).clusterFaults() {
		if !before[d.Why] {
			return d.Why
		}
	}
	return ""
}

// settingRefusal says which of v's own settings no placement can mend (a
// reservation on a passthrough vNIC, a reservation above its limit), or "".
func settingRefusal(v *policy.VM) string {
	for _, n := range v.NICs {
		if n.VF {
			if why := vfRefusal(v, &n); why != "" {
				return why
			}
		} else if n.Passthrough && n.Reservation > 0 {
			return fmt.Sprintf("%s is a passthrough vNIC: it bypasses the scheduler and takes no reservation", policy.PortName(v.Name, n.Name))
		}
		if n.Limit != policy.Unlimited && n.Reservation > n.Limit {
			return fmt.Sprintf("%s reservation %s > limit %s", policy.PortName(v.Name, n.Name), fmtRate(float64(n.Reservation)), fmtRate(float64(n.Limit)))
		}
		if in := n.Ingress; in != nil && in.Limit != policy.Unlimited && in.Reservation > in.Limit {
			return fmt.Sprintf("%s ingress reservation %s > limit %s", policy.PortName(v.Name, n.Name), fmtRate(float64(in.Reservation)), fmtRate(float64(in.Limit)))
		}
		if n.Passthrough && !n.VF && n.Ingress != nil {
			return fmt.Sprintf("%s is a passthrough vNIC: it bypasses the scheduler and takes no ingress setting", policy.PortName(v.Name, n.Name))
		}
	}
	for _, d := range v.Disks {
		if d.LimitIOPS != policy.UnlimitedIOPS && d.ReservationIOPS > d.LimitIOPS {
			return fmt.Sprintf("%s/%s reservation %d IOPS > limit %d IOPS", v.Name, d.Name, d.ReservationIOPS, d.LimitIOPS)
		}
	}
	if v.CPU.LimitMHz > 0 && v.CPU.ReservationMHz > v.CPU.LimitMHz {
		return fmt.Sprintf("%s cpu reservation %dMHz > limit %dMHz", v.Name, v.CPU.ReservationMHz, v.CPU.LimitMHz)
	}
	if v.CPU.LimitMHz > 0 && v.LatencySensitive {
		return fmt.Sprintf("%s is latency-sensitive: it takes no CPU limit (its vCPUs run on cores of their own)", v.Name)
	}
	return ""
}

// hostScope is the scope of newScopedState that holds the hosts named
// name.
func hostScope(p *policy.Policy, name string) []bool {
	scope := make([]bool, len(p.Hosts))
	for i := range p.Hosts {
		scope[i] = p.Hosts[i].Name == name
	}
	return scope
}

// isUplinkChange reports a lost uplink: it is a fault to report, not a
// request that can be refused.
func isUplinkChange(c Change) bool { return c.Field == "down" }

// clonePolicy copies p's lists of hosts, VMs, traffic classes and network
// pools, which a change edits in place. The lists inside a host or a VM
// (uplinks, NICs, disks) stay shared with p: a change that edits one
// makes it new first (Change.apply), so that p is never modified.
func clonePolicy(p *policy.Policy) *policy.Policy {
	np := *p
	np.Hosts = slices.Clone(p.Hosts)
	np.VMs = slices.Clone(p.VMs)
	np.TrafficClasses = slices.Clone(p.TrafficClasses)
	np.NetworkPools = slices.Clone(p.NetworkPools)
	return &np
}

// vfRefusal says why the rates of n, an SR-IOV VF, cannot be set, or "":
// a VF takes no shares or ingress, and its rates are whole Mbit/s (the
// kernel's unit; a change is not rounded as the file is), its limit at
// least 1 Mbit/s.
func vfRefusal(v *policy.VM, n *policy.NIC) string {
	port := policy.PortName(v.Name, n.Name)
	switch {
	case n.Shares != policy.NetSharesNormal || n.Ingress != nil:
		return port + " is an SR-IOV VF: it bypasses the host's scheduler and takes only a reservation and a limit"
	case n.Reservation%policy.MbpsBps != 0 || n.Limit != policy.Unlimited && n.Limit%policy.MbpsBps != 0:
		return port + " is an SR-IOV VF: its rates are whole Mbit/s (min_tx_rate, max_tx_rate)"
	case n.Limit < policy.MbpsBps:
		return port + " is an SR-IOV VF: its limit is at least 1Mbps"
	}
	return ""
}
