// Package policy is the one model of a sluice cluster that every other part
// reads: hosts, uplinks, traffic classes, network pools, datastores and VMs
// with their reservations, shares and limits. It loads and validates the YAML
// (or JSON) policy file of DESIGN.md §4; its capacity rules are the checks
// of package feasible, which placement and the hook apply too. It computes
// no entitlements and touches no kernel state.
package policy

import (
	"math"
	"time"

	"sluice/parda"
)

// Bps is a rate in bits per second (decimal units: 1 Mbps = 1e6 bps).
type Bps int64

// IOPS is a rate of I/O requests per second.
type IOPS int64

// Bytes is a size in bytes (binary units: 1 KiB = 1024 bytes).
type Bytes int64

// Unlimited is the value of a rate limit that is not set (or set to
// `unlimited`). Never add it to anything.
const (
	Unlimited     Bps  = math.MaxInt64
	UnlimitedIOPS IOPS = math.MaxInt64
)

// Share keywords per resource (DESIGN.md §1).
const (
	NetSharesLow, NetSharesNormal, NetSharesHigh             = 25, 50, 100
	StorageSharesLow, StorageSharesNormal, StorageSharesHigh = 500, 1000, 2000
	CPUSharesLow, CPUSharesNormal, CPUSharesHigh             = 500, 1000, 2000 // per vCPU
)

// DefaultReservationCap is the fraction of an uplink's line rate that class
// reservations may take when the file does not say.
const DefaultReservationCap = 0.75

// Traffic classes that NetIOC knows, in the order they are listed.
var TrafficClassNames = []string{"management", "vm", "nfs", "vsan", "iscsi", "vmotion", "replication", "ft", "backup"}

// Policy is a whole cluster as declared in a policy file.
type Policy struct {
	Cluster        string
	ReservationCap float64 // fraction of each uplink's Speed that may be reserved, (0,1]
	Hosts          []Host
	// TrafficClasses holds every class of TrafficClassNames, in that order;
	// classes the file does not name have shares normal and Declared false.
	TrafficClasses []TrafficClass
	NetworkPools   []NetworkPool
	Datastores     []Datastore
	VMs            []VM
	// PortGroups are the port groups the file declares (optional section).
	// When the section is absent, any port group name may be used.
	PortGroups []PortGroup
	// UnnamedVMs is what each vNIC of a running VM that the policy does
	// not name gets on its host (the agent learns such VMs from the
	// hypervisor): a class of its own in the vm class with these
	// settings.
	UnnamedVMs UnnamedVNIC

	// Pos records the lines of the top-level keys (e.g. "reservationCap").
	Pos Pos

	// File is the name the policy was loaded from (for messages).
	File string
}

// Host is a hypervisor machine.
type Host struct {
	Name    string
	CPU     HostCPU
	Memory  Bytes
	Uplinks []Uplink
	Pos     Pos
}

// HostCPU is a host's processor capacity.
type HostCPU struct {
	Cores int
	MHz   int // per core
	// SendMHzPerGbps is what sending costs a VM's CPU on this host, MHz
	// per Gbps of payload above SendOverheadMHz, as measured on the host
	// (docs/perf/cpu.md); 0: not measured (sluice explain then uses the
	// simulator's seed-003 model).
	SendMHzPerGbps  int
	SendOverheadMHz int
	// HostCores is how many cores (Linux CPUs 0..HostCores-1) are kept
	// for the host itself (its own threads, QEMU's emulator threads): a
	// latency-sensitive VM's vCPUs are pinned to cores of their own among
	// the others (cpuctl.Pin). The file's default is 1 when cores are
	// given; 0 keeps none.
	HostCores int
}

// Uplink is a physical NIC of a host.
type Uplink struct {
	Name   string
	Speed  Bps // line rate; reservationCap applies to it
	Usable Bps // payload capacity that alloc divides; equals Speed when not given
	Pos    Pos
}

// TrafficClass is the per-uplink setting of one class of system traffic.
type TrafficClass struct {
	Name        string
	Shares      int
	Reservation Bps
	Limit       Bps  // Unlimited when not set
	Declared    bool // the file names this class (alloc gives it unlimited demand)
	// Ingress is the class's setting for what it receives through an
	// uplink; nil: the file gives none (inbound, the class has shares
	// normal, no reservation and no limit, and carries no traffic in
	// `sluice alloc`).
	Ingress *Ingress
	Pos     Pos
}

// Ingress is the setting of a port for the traffic it receives: what
// enters through its uplink towards it. The rule is the outbound one
// (DESIGN.md §2, additive), on a tree of its own per uplink with a budget
// of its own (reservationCap × speed).
type Ingress struct {
	Shares      int
	Reservation Bps
	Limit       Bps // Unlimited when not set
}

// ReservationBps is the reservation of in, 0 when in is nil.
func (in *Ingress) ReservationBps() Bps {
	if in == nil {
		return 0
	}
	return in.Reservation
}

// NetworkPool is a reservation quota carved out of the vm class, usable only
// by vNICs of its port groups.
type NetworkPool struct {
	Name        string
	Reservation Bps
	PortGroups  []string
	// Hosts the pool spans: the file's `hosts:` list, or every host of the
	// cluster when the file does not say. The quota is checked against
	// reservationCap × the sum of these hosts' uplink speeds.
	Hosts []string
	Pos   Pos
}

// PortGroup is a named group of vNICs on the distributed switch.
type PortGroup struct {
	Name string
	VLAN int // 0 when not set
	Pos  Pos
}

// UnnamedVNIC is the setting of every vNIC of a running VM that the
// policy does not name (the top-level `unnamedVMs`). The default is
// shares normal, no reservation and no limit.
type UnnamedVNIC struct {
	Shares      int
	Reservation Bps
	Limit       Bps // Unlimited when not set
	Pos         Pos
}

// UnnamedVNICSetting returns UnnamedVMs with the defaults filled in for a
// Policy built in code rather than decoded (shares 0 is normal, limit 0
// is unlimited: a decoded file never has either).
func (p *Policy) UnnamedVNICSetting() UnnamedVNIC {
	u := p.UnnamedVMs
	if u.Shares == 0 {
		u.Shares = NetSharesNormal
	}
	if u.Limit == 0 {
		u.Limit = Unlimited
	}
	return u
}

// Datastore is shared storage used by several hosts.
type Datastore struct {
	Name string
	// Driver is how its disks' I/O is controlled: DriverThrottle,
	// DriverGateway, or "" when the file does not say (DriverAt decides).
	Driver string
	SIOC   SIOC
	Array  Array
	// CapacityIOPS is the IOPS the operator declares the datastore serves
	// (0: not declared): it bounds the disks' reservations in admission
	// and is the capacity the storage derivation divides.
	CapacityIOPS IOPS
	// MeasuredIOPS is the capacity the hosts measured (parda.Capacity),
	// set by the controller from their reports or by an agent deciding a
	// start itself (WithMeasuredIOPS), never by the file (0: none). It
	// counts where the file declares neither capacityIOPS nor array.
	MeasuredIOPS IOPS
	Pos          Pos
}

// Storage drivers of a datastore.
const (
	// DriverThrottle controls the disks QEMU already has: every period the
	// host's agent sets each disk's QEMU throttle (package throttle).
	DriverThrottle = "throttle"
	// DriverGateway puts sluice's NBD gateway (package storage) on the
	// I/O path, on volumes that `sluice datastore create` made.
	DriverGateway = "gateway"
)

// DriverAt is the datastore's driver on a host, the one rule for a
// datastore whose file gives no driver: the gateway where the datastore
// holds the gateway's stats volume (`sluice datastore create` made it, so
// its disks are the gateway's volumes), the throttle driver otherwise (the
// operator's own disks). gatewayMade says whether the stats volume is
// there. A driver the file gives is kept.
func (ds *Datastore) DriverAt(gatewayMade bool) string {
	switch {
	case ds.Driver != "":
		return ds.Driver
	case gatewayMade:
		return DriverGateway
	}
	return DriverThrottle
}

// SIOC configures storage I/O control on a datastore. The PARDA gains
// are those of parda.Config (the scaled law, parda.Controller.UpdateScaled);
// the decoder fills in the defaults.
type SIOC struct {
	Enabled             bool
	CongestionThreshold time.Duration // default 30ms
	ControlPeriod       time.Duration // PARDA period, default 4s
	// Gamma is PARDA's smoothing factor γ in (0, 1], default 0.8.
	Gamma float64
	// ShareTerm is the fraction b in (0, 1) of the datastore's total window
	// that is split by shares every period, default 0.3.
	ShareTerm float64
	// MinWindow and MaxWindow bound each host's window (I/Os outstanding
	// on the datastore), default 4 and 256.
	MinWindow, MaxWindow int
}

// Controller is the window control of a datastore with SIOC s: package
// parda's scaled law (parda.Controller.UpdateScaled) with the datastore's
// threshold and gains. The share term is a fraction b (ShareTerm) of the
// datastore's total window, split by active shares, and the threshold is
// lowered to (1−b)·L, so that the fixed point is latency = L exactly and
// windows in the ratio of the hosts' active shares, whatever the array's
// speed (docs/parda.md). Zero fields (a policy built in code) take
// parda's defaults, which are the policy's. The gateway and the throttle
// driver both use it.
func (s SIOC) Controller() *parda.Controller {
	th := s.CongestionThreshold
	if th <= 0 {
		th = DefaultCongestionThreshold
	}
	return parda.New(parda.Config{ThresholdNs: float64(th.Nanoseconds()), Gamma: s.Gamma, ShareTerm: s.ShareTerm,
		Min: float64(s.MinWindow), Max: float64(s.MaxWindow)})
}

// Defaults of the PARDA gains: parda's own.
const (
	DefaultSIOCGamma     = parda.DefaultGamma
	DefaultSIOCShareTerm = parda.DefaultShareTerm
	DefaultSIOCMinWindow = parda.DefaultMin
	DefaultSIOCMaxWindow = parda.DefaultMax
)

// Array models the datastore's device: Slots parallel servers, each taking
// ServiceTime per 4 KiB I/O.
type Array struct {
	Slots       int
	ServiceTime time.Duration
}

// VM is a virtual machine.
type VM struct {
	Name       string
	Host       string // empty: placement chooses
	CPU        VMCPU
	Memory     Bytes
	NICs       []NIC
	Disks      []Disk
	Migratable bool // false for VMs pinned by passthrough devices; default true
	// LatencySensitive (latency: sensitive) gives the VM's vNICs strict
	// priority over their siblings' within their reservation and, on a
	// host whose cores are modelled, each of its vCPUs a core of its own
	// (cpuctl.Pin) and no CPU limit.
	LatencySensitive bool
	Lab              VMLab
	Pos              Pos
}

// Values of a VM's latency setting.
const (
	LatencyNormal    = "normal"
	LatencySensitive = "sensitive"
)

// VMLab says how `sluice lab` builds a VM; the agent and the simulator
// ignore it.
type VMLab struct {
	Kind string // LabNetns (also when empty) or LabQemu
}

// Kinds of lab VM.
const (
	// LabNetns is a network namespace with a veth on its host's bridge.
	LabNetns = "netns"
	// LabQemu is a real QEMU guest under libvirt (TCG) with a tap on its
	// host's bridge.
	LabQemu = "qemu"
)

// VMCPU is a VM's processor entitlement settings.
type VMCPU struct {
	VCPUs          int
	Shares         int // total for the VM (keyword value × vCPUs)
	ReservationMHz int
	LimitMHz       int // 0 means unlimited
}

// NIC is a VM's virtual network adapter: a port.
type NIC struct {
	Name        string
	PortGroup   string
	Shares      int
	Reservation Bps
	Limit       Bps    // Unlimited when not set
	Uplink      string // optional pinning to one uplink of the host
	Passthrough bool   // bypasses the scheduler; the VM cannot migrate
	// VF says the passthrough vNIC is an SR-IOV virtual function of the
	// uplink Uplink, its PF (`passthrough: vf`). Its Reservation and Limit
	// are the VF's min_tx_rate and max_tx_rate, which the kernel takes in
	// whole Mbit/s: the decoder rounds the reservation up and the limit
	// down (VFTxRates), so the model holds what the NIC is told. The
	// reservation counts against the PF's vm budget like any pinned
	// vNIC's; the vNIC is on no HTB tree.
	VF bool
	// Ingress is the vNIC's setting for what it receives; nil: its
	// inbound traffic is not controlled.
	Ingress *Ingress
	Pos     Pos
}

// Disk is a VM's virtual disk on a datastore.
type Disk struct {
	Name            string
	Datastore       string
	Shares          int
	ReservationIOPS IOPS
	LimitIOPS       IOPS // UnlimitedIOPS when not set
	Size            Bytes
	Pos             Pos
}

// Pos records where an entity and its fields were written, for messages.
// Line is the line of the entity itself; Fields maps a field's YAML key to
// the line of its value.
type Pos struct {
	Line   int
	Fields map[string]int
}

// FieldLine returns the line of the field key, or the entity's line.
func (p Pos) FieldLine(key string) int {
	if l, ok := p.Fields[key]; ok {
		return l
	}
	return p.Line
}

// PortName is the name of a VM's vNIC as a port: "VM/NIC".
func PortName(vm, nic string) string { return vm + "/" + nic }

// ClassName is the name of a system traffic class on a host: "HOST/CLASS".
func ClassName(host, class string) string { return host + "/" + class }

// MbpsBps is one Mbit/s in bits/s: the unit of a VF's tx rates.
const MbpsBps Bps = 1_000_000

// VFTxRates returns the VF's min_tx_rate and max_tx_rate in Mbit/s, as
// the kernel's IFLA_VF_RATE takes them: the reservation (rounded up to a
// whole Mbit/s) and the limit (rounded down; 0: unlimited, the kernel's
// "no limit"). A decoded file holds whole values already.
func (n *NIC) VFTxRates() (minMbps, maxMbps uint32) {
	r := (n.Reservation + MbpsBps - 1) / MbpsBps
	if n.Limit != Unlimited {
		maxMbps = uint32(min(n.Limit/MbpsBps, 1<<32-1))
	}
	return uint32(min(r, 1<<32-1)), maxMbps
}
