// Package explain says why a port or a disk gets what it gets: the one
// explanation that `sluice explain`, `sluice ctl explain` and the console
// print (issue 23). For a port (VM/NIC, HOST/CLASS or HOST/UPLINK/CLASS)
// it is the network entitlement level by level, what the port receives
// when it has an ingress setting, and for a vNIC what its VM's CPU
// entitlement can drive; for a disk (VM/DISK) its share of its datastore
// and the driver that controls it.
//
// explain computes from values: it reads no file, no clock and no
// kernel. What only a host can say (the throttle driver's status there)
// comes in through Options.HostLocal.
package explain

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"sluice/entitle"
	"sluice/feasible"
	"sluice/policy"
)

// ErrNoSuchPort is wrapped by the error of Lines for a name that is no
// port or disk.
var ErrNoSuchPort = errors.New("no such port or disk")

// Options are what an explanation takes besides the policy and the live
// state. The zero value explains with unbounded demands, each host's
// cost of sending and no host-local lines.
type Options struct {
	// DemandBps gives what ports send, bits/s by port name as
	// entitle.Network takes them (alloc.Inf: unbounded); the ports it does
	// not name send without bound.
	DemandBps map[string]float64
	// CPUMHzPerGbps, above 0, replaces the cost of sending per Gbps of
	// every host (measured or the model's) with a linear one, keeping a
	// measured overhead; CPUCostSource names where it comes from in the
	// cpu line ("--cpu-mhz-per-gbps"; "": "given").
	CPUMHzPerGbps float64
	CPUCostSource string
	// HostLocal, when set, gives the lines about disk that only host, the
	// host of its VM, can say (the throttle driver's status file there):
	// they end the disk's explanation.
	HostLocal func(host, disk string) []string
}

// Lines says in words and numbers why name gets what it gets, one string
// per line, with the VMs where live says they run (entitle.Live; its zero
// value: every VM on its policy host):
//
//   - a port (VM/NIC, HOST/CLASS or HOST/UPLINK/CLASS): its outbound
//     entitlement level by level (entitle.Net.Explain); for a port of the
//     inbound trees (a vNIC with an ingress setting; a class, with one or
//     not), that part headed "outbound (what PORT sends):" and followed by
//     "inbound (what PORT receives):" and the inbound one, every demand
//     unbounded; for a vNIC without one, while some other port has one, a
//     line saying what it receives is not controlled; then, for a vNIC of
//     a VM of the policy whose host has CPU figures, a "cpu:" line;
//   - else a disk (VM/DISK of a VM with a host): its entitlement on its
//     datastore at the array's nominal rate with every disk's demand
//     unbounded, the datastore's driver (DriverLine), and the host-local
//     lines of opt.HostLocal.
//
// A demand that names no port is that error; a name that is no port or
// disk is an error wrapping ErrNoSuchPort.
func Lines(p *policy.Policy, live entitle.Live, name string, opt Options) ([]string, error) {
	d := entitle.Derive(p, live)
	out := entitle.NewNet(d)
	if err := out.SetDemands(p, opt.DemandBps); err != nil {
		return nil, err
	}
	out.Compute()
	lines, err := out.Explain(name)
	if err != nil {
		if lines, ok := vfLines(p, d, name); ok {
			return lines, nil
		}
		if lines, ok := disk(p, name, opt); ok {
			return lines, nil
		}
		return nil, fmt.Errorf("%s: %w", name, ErrNoSuchPort)
	}
	if vmName, _, ok := strings.Cut(name, "/"); ok {
		if vm := p.VM(vmName); vm != nil && vm.LatencySensitive {
			lines = append(lines, fmt.Sprintf("latency: %s is latency-sensitive: its vNICs are served before their siblings (HTB priority 0, the others 1) while within their rates", vm.Name))
			if ps := out.Port(name); len(ps) > 0 && ps[0].Tree != nil && ps[0].Tree.Spec != nil {
				lines = append(lines, SegmentWaitLine(ps[0].Tree.Spec.SpeedBps))
			}
		}
		if vm := p.VM(vmName); vm != nil {
			if l, ok := PinLine(p, live, vm); ok {
				lines = append(lines, l)
			}
		}
	}
	in := entitle.NewInboundNet(d)
	in.Compute()
	lines = withInbound(in, name, lines)
	if l, ok := cpuLine(p, live, out, name, opt); ok {
		lines = append(lines, l)
	}
	return lines, nil
}

// withInbound adds to the explanation of port (outbound) that of what it
// receives, when it is a port of the inbound net in: the two parts are
// headed "outbound:" and "inbound:". Otherwise the explanation is as it
// was, with a line saying its inbound traffic is not controlled when
// some other port is controlled (entitle.Net.Controlled).
func withInbound(in *entitle.Net, port string, out []string) []string {
	inLines, err := in.Explain(port)
	if err != nil {
		if len(in.Controlled()) > 0 {
			out = append(out, port+" has no ingress setting: what it receives is not controlled")
		}
		return out
	}
	lines := append([]string{"outbound (what " + port + " sends):"}, out...)
	lines = append(lines, "inbound (what "+port+" receives):")
	return append(lines, inLines...)
}

// disk explains the disk VM/DISK named name on its datastore, with its
// datastore's driver and opt's host-local lines; false when name is no
// disk of a VM with a host.
func disk(p *policy.Policy, name string, opt Options) ([]string, bool) {
	vmName, diskName, _ := strings.Cut(name, "/")
	vm := p.VM(vmName)
	if vm == nil {
		return nil, false
	}
	for _, dk := range vm.Disks {
		ds := p.Datastore(dk.Datastore)
		if dk.Name != diskName || ds == nil {
			continue
		}
		s, err := entitle.Storage(p, ds.Name, 0, nil)
		if err != nil || s.Disk(name) == nil {
			return nil, false
		}
		lines, err := s.Explain(name)
		if err != nil {
			return nil, false
		}
		lines = append(lines, CapacityLine(ds), DriverLine(ds))
		if opt.HostLocal != nil {
			lines = append(lines, opt.HostLocal(s.Disk(name).Host, name)...)
		}
		return lines, true
	}
	return nil, false
}

// CapacityLine says where the capacity of ds comes from: its declared
// capacityIOPS, its emulated array, what its hosts measured, or none (the
// derivation then divides the default array's rate, and admission bounds
// no IOPS reservation on it).
func CapacityLine(ds *policy.Datastore) string {
	q := ds.IOPSQuota()
	if q.Cap == feasible.Unlimited {
		return fmt.Sprintf("capacity: datastore %s declares none and its hosts measured none: the derivation divides the default array's %d IOPS, and admission bounds no IOPS reservation on it",
			ds.Name, ds.NominalIOPS())
	}
	return fmt.Sprintf("capacity: %d IOPS, %s; admission bounds the disks' IOPS reservations on %s by it", q.Cap, q.Why, ds.Name)
}

// DriverLine says which driver controls the disks of ds: the one the
// file gives, else the rule of policy.Datastore.DriverAt.
func DriverLine(ds *policy.Datastore) string {
	if ds.Driver != "" {
		return fmt.Sprintf("driver: %s (datastore %s says so)", ds.Driver, ds.Name)
	}
	return fmt.Sprintf("driver: %s where `sluice datastore create` made datastore %s (its stats volume is there), else %s",
		ds.DriverAt(true), ds.Name, ds.DriverAt(false))
}

// vfLines explains the SR-IOV VF vNIC name (passthrough: vf) of a VM that
// runs by d: its PF, its rates as the NIC is told them, and that it
// bypasses the host's scheduler. Which VF of the PF it is only the host
// knows (the agent's status); false when name is no such vNIC.
func vfLines(p *policy.Policy, d *entitle.Desired, name string) ([]string, bool) {
	for _, u := range d.Uplinks {
		for _, v := range u.VFs {
			if v.Port != name {
				continue
			}
			lim := fmt.Sprintf("%d Mbit/s", v.MaxTxMbps)
			if v.MaxTxMbps == 0 {
				lim = "0 (no limit)"
			}
			out := []string{
				fmt.Sprintf("%s on host %s is an SR-IOV virtual function of uplink %s (its PF): it bypasses the host's scheduler (no HTB class, no shares); the NIC enforces its rates in hardware",
					name, u.Host, u.Uplink),
				fmt.Sprintf("  min_tx_rate %d Mbit/s (its reservation, rounded up to whole Mbit/s), max_tx_rate %s (its limit, rounded down)", v.MinTxMbps, lim),
				fmt.Sprintf("  admission counts its %d Mbit/s against %s's vm budget like an HTB vNIC's; the HTB tree of %s divides %s, its usable rate less the %s its VFs reserve",
					v.MinTxMbps, u.Uplink, u.Uplink, policy.FormatRate(policy.Bps(u.UsableBps)), policy.FormatRate(policy.Bps(u.VFReservedBps))),
				fmt.Sprintf("  %s is not migratable: a passthrough device pins it to its host, placement never moves it", v.VM),
			}
			return out, true
		}
	}
	vmName, nic, ok := strings.Cut(name, "/")
	if vm := p.VM(vmName); ok && vm != nil {
		for _, n := range vm.NICs {
			if n.Name == nic && n.Passthrough {
				return []string{fmt.Sprintf("%s is a passthrough vNIC: it bypasses the host's scheduler (no HTB class, no reservation, shares or limit) and %s is not migratable", name, vm.Name)}, true
			}
		}
	}
	return nil, false
}

// SegmentWaitLine says how long a latency-sensitive packet may still
// wait behind one segment of another VM that its uplink has begun to
// send (the priority orders what waits, it cannot preempt what is on the
// wire): 64 KiB, a guest's largest TSO/GSO segment, at the line rate;
// and the bound when the other guests cap their segments at 16 KiB, with
// which the lab's p99 met 1.2× alone (docs/perf/network.md).
func SegmentWaitLine(speedBps float64) string {
	wait := func(bytes float64) string {
		return time.Duration(bytes * 8 / speedBps * 1e9).Round(time.Microsecond).String()
	}
	if !(speedBps > 0) {
		return "latency: a packet may still wait behind one 64 KiB segment of another VM being sent (the uplink's speed is unknown)"
	}
	return fmt.Sprintf("latency: a packet may still wait behind one 64 KiB segment of another VM being sent: %s at %s; with the other guests' GSO capped at 16 KiB (ip link set dev DEV gso_max_size 16384 in the guest), %s",
		wait(64<<10), entitle.FormatBps(speedBps), wait(16<<10))
}
