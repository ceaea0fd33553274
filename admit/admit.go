// Package admit decides whether a VM may start on a host: the decision of
// sluice's libvirt hook (`sluice hook qemu`), taken before the domain
// starts. The rule is placement's admission (placement.Plan, which asks
// package feasible's checks, the ones policy validation applies too),
// applied to the one host and the VMs that run on it now, so that
// admission at VM start and placement's admission never disagree.
//
// admit is pure: no I/O, no clock. The hook reads the policy and what
// runs on the host, and carries out the decision.
package admit

import (
	"fmt"
	"strings"

	"sluice/placement"
	"sluice/policy"
)

// Domain is a libvirt domain as the policy may name it: by name or by
// UUID.
type Domain struct {
	Name, UUID string
	// VNICs is how many network interfaces the domain has (other than
	// passthrough ones): a domain the policy does not name reserves the
	// policy's unnamedVMs reservation on each.
	VNICs int
}

// Decision is whether a domain may start, and why (one line, then one
// line per shortfall).
type Decision struct {
	Allow bool
	// VM is the policy's name of the domain; for a domain the policy does
	// not name, its domain name when its unnamedVMs reservation was
	// checked, else "".
	VM      string
	Why     string
	Details []string
}

// String is the decision as the hook prints it.
func (d Decision) String() string {
	verb := "admitted"
	if !d.Allow {
		verb = "refused"
	}
	s := fmt.Sprintf("sluice: %s %s: %s", verb, d.VM, d.Why)
	if d.VM == "" {
		s = fmt.Sprintf("sluice: %s: %s", verb, d.Why)
	}
	if len(d.Details) > 0 {
		s += ": " + strings.Join(d.Details, "; ")
	}
	return s
}

// VMName returns the policy's name of d (its VM named by the domain's
// name or, without regard to case, its UUID), or "".
func VMName(p *policy.Policy, d Domain) string {
	for _, vm := range p.VMs {
		if vm.Name == d.Name {
			return vm.Name
		}
	}
	for _, vm := range p.VMs {
		if d.UUID != "" && strings.EqualFold(vm.Name, d.UUID) {
			return vm.Name
		}
	}
	return ""
}

// Decide tells whether dom may start on host given the domains that run
// there now (running; dom itself is ignored among them). Every running
// domain the policy names counts with its reservations (CPU MHz, memory,
// vNIC reservations by the policy's uplink rule and reservationCap, IOPS
// of its disks); one it does not name reserves the policy's unnamedVMs
// reservation on each of its vNICs (and no CPU, memory or IOPS), as the
// agent's derivation gives it. dom is admitted when placement admits it
// on this host; otherwise it is refused with placement's shortfalls. A
// domain the policy does not name is admitted without a check when
// unnamedVMs reserves nothing, and so is any domain of a host the policy
// does not know (sluice has no say there).
//
// Only this host's VMs are counted: cluster-wide quotas (network pools,
// datastore IOPS) see the VMs of this host, not those of the others.
func Decide(p *policy.Policy, host string, dom Domain, running []Domain) Decision {
	h := p.Host(host)
	if h == nil {
		return Decision{Allow: true, Why: fmt.Sprintf("host %q is not in the policy; sluice does not decide here", host)}
	}
	name := VMName(p, dom)
	unnamedR := p.UnnamedVNICSetting().Reservation
	if name == "" && (unnamedR == 0 || dom.VNICs == 0) {
		return Decision{Allow: true, Why: fmt.Sprintf("domain %s is not named by the policy: it reserves nothing", dom.Name)}
	}
	// The cluster as this host sees it: the host, the VMs that run on it,
	// and the one that asks to start (without a host: a power-on).
	q := *p
	q.Hosts = []policy.Host{*h}
	q.VMs = nil
	cur := placement.Placement{}
	self, label := vmOf(p, dom)
	name = self.Name
	seen := map[string]bool{name: true}
	for _, r := range running {
		vm, _ := vmOf(p, r)
		if seen[vm.Name] || (VMName(p, r) == "" && (unnamedR == 0 || r.VNICs == 0)) {
			continue
		}
		seen[vm.Name] = true
		vm.Host = host
		q.VMs = append(q.VMs, vm)
		cur[vm.Name] = host
	}
	self.Host = ""
	q.VMs = append(q.VMs, self)
	r := placement.Plan(&q, cur, placement.Demand{}, placement.Options{Threshold: 1, MaxMoves: -1})
	for _, d := range r.Decisions {
		if d.VM != name {
			continue
		}
		switch d.Kind {
		case placement.Admit:
			return Decision{Allow: true, VM: name, Why: fmt.Sprintf("its reservations%s fit on %s with the %d VMs that run there", label, host, len(cur))}
		case placement.Refuse:
			var det []string
			for _, s := range d.Details {
				det = append(det, strings.TrimPrefix(s, host+": "))
			}
			why := fmt.Sprintf("its reservations%s do not fit on %s with the %d VMs that run there", label, host, len(cur))
			if strings.Contains(d.Why, "quota") {
				why = d.Why
			}
			return Decision{VM: name, Why: why, Details: det}
		}
	}
	return Decision{VM: name, Why: "placement took no decision on it (a bug: please report)"}
}

// vmOf returns the policy's VM of d, or for a domain the policy does not
// name a VM of its name whose every vNIC has the policy's unnamedVMs
// setting (label then says so).
func vmOf(p *policy.Policy, d Domain) (policy.VM, string) {
	if n := VMName(p, d); n != "" {
		return *p.VM(n), ""
	}
	set := p.UnnamedVNICSetting()
	vm := policy.VM{Name: d.Name, CPU: policy.VMCPU{VCPUs: 1, Shares: policy.CPUSharesNormal}, Migratable: true}
	for k := range d.VNICs {
		vm.NICs = append(vm.NICs, policy.NIC{Name: fmt.Sprintf("nic%d", k), Shares: set.Shares, Reservation: set.Reservation, Limit: set.Limit})
	}
	return vm, fmt.Sprintf(" (unnamedVMs: %s per vNIC, %d vNICs)", policy.FormatRate(set.Reservation), d.VNICs)
}
