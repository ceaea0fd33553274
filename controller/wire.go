package controller

import (
	"math"
	"sort"
	"time"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/policy"
)

// The JSON bodies of the API (api/openapi.yaml). Rates are bits/s, IOPS
// are I/O per second; a limit that is absent (null) means unlimited.

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error string `json:"error"` // one line
	// Problems are the policy's problems, one per line: FILE:LINE: field: message.
	Problems []string `json:"problems,omitempty"`
	// Details are per-host shortfalls of a refused power-on.
	Details []string `json:"details,omitempty"`
}

// ApplyRequest is a policy document to apply.
type ApplyRequest struct {
	File     string `json:"file"`     // the name problems are reported with
	Document string `json:"document"` // the policy YAML
	Reason   string `json:"reason,omitempty"`
}

// PolicyState is the stored policy: the document as applied and the
// changes made since, in order. The policy in force is the document with
// every change applied (placement.Change.Apply).
type PolicyState struct {
	Revision  int64     `json:"revision"` // 1 for the first apply; +1 per apply or set
	File      string    `json:"file"`
	Document  string    `json:"document"`
	Changes   []string  `json:"changes,omitempty"`
	AppliedAt time.Time `json:"applied_at"`
}

// SetRequest is a list of changes in placement's grammar
// (TARGET.FIELD=VALUE), made together or not at all.
type SetRequest struct {
	Changes []string `json:"changes"`
	Reason  string   `json:"reason,omitempty"`
}

// PowerOnRequest powers a VM on; Host empty: placement chooses.
type PowerOnRequest struct {
	Host   string `json:"host,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// AdmitRequest asks whether a domain may start on Host: the libvirt hook
// of Host asks its agent, which asks the controller. The domain is the
// policy's VM of the path's name, or of UUID (a policy may name VMs by
// their libvirt UUID).
type AdmitRequest struct {
	Host   string `json:"host"`
	UUID   string `json:"uuid,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// AdmitAnswer is the controller's answer: a refusal says why, with the
// per-host shortfalls; an admission holds the VM's reservations on Host
// while it starts (as a power-on does).
type AdmitAnswer struct {
	Allow    bool     `json:"allow"`
	VM       string   `json:"vm"` // the policy's name of the domain
	Why      string   `json:"why"`
	Details  []string `json:"details,omitempty"`
	Revision int64    `json:"revision"` // the policy revision decided on
}

// MigrateRequest asks to move a VM to host To.
type MigrateRequest struct {
	To     string `json:"to"`
	Reason string `json:"reason,omitempty"`
}

// ApproveRequest approves a recommended decision.
type ApproveRequest struct {
	Reason string `json:"reason,omitempty"`
}

// Result is the answer to a change: the policy revision after it and the
// events it recorded.
type Result struct {
	Revision int64   `json:"revision"`
	Events   []Event `json:"events"`
}

// Event is one recorded change or decision with its reason.
type Event struct {
	Seq     int64     `json:"seq"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`    // apply, set, power-on, migrate, migrated, migrate-failed, superseded, fault, recommend, observed, off, register, more
	Subject string    `json:"subject"` // VM, VM/NIC, host or file
	Message string    `json:"message"`
	Reason  string    `json:"reason"`
}

// Decision is a migration recorded by the controller. Status:
// recommended (placement's repair or rebalancing move, waiting for
// Approve in manual mode), moving (carried out: the VM's placement
// changed and the agents move it), done (the destination's agent reports
// the VM), or superseded (the VM no longer runs where the decision
// found it).
type Decision struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	VM     string    `json:"vm"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Status string    `json:"status"`
	Reason string    `json:"reason"`
}

// HostInfo is a host of the policy with what its agent reported.
type HostInfo struct {
	Name       string   `json:"name"`
	Registered bool     `json:"registered"` // its agent holds a live lease
	VMs        []string `json:"vms"`        // VMs the controller runs there
	Uplinks    []string `json:"uplinks"`
	Report     *Report  `json:"report,omitempty"`
	// ReservedBps is the sum of its running vNICs' reservations.
	ReservedBps float64 `json:"reserved_bps"`
}

// VMInfo is a VM of the policy: where it should run (desired), where it
// runs (observed) and what its vNICs get.
type VMInfo struct {
	Name string `json:"name"`
	Host string `json:"host"` // desired: "" when not placed
	// Observed is the host whose agent reports it running ("" when none
	// does); State says what the controller makes of both: running,
	// starting (placed, not yet seen: it holds its reservations for
	// StartGrace), moving, off, or unknown (its host has no agent).
	Observed       string    `json:"observed"`
	State          string    `json:"state"`
	Since          time.Time `json:"since,omitzero"` // when the state began, as far as known
	VCPUs          int       `json:"vcpus"`
	CPUReservation int       `json:"cpu_reservation_mhz"`
	MemoryBytes    int64     `json:"memory_bytes"`
	NICs           []NICInfo `json:"nics"`
}

// NICInfo is one vNIC: its R/S/L and its entitlement with every vNIC's
// demand unbounded (what `sluice alloc` gives).
type NICInfo struct {
	Port           string   `json:"port"`
	Uplink         string   `json:"uplink,omitempty"` // HOST/UPLINK
	ReservationBps float64  `json:"reservation_bps"`
	Shares         float64  `json:"shares"`
	LimitBps       *float64 `json:"limit_bps"`
	AllocBps       float64  `json:"alloc_bps"`
}

// Explanation is why a port gets what it gets, level by level.
type Explanation struct {
	Port  string   `json:"port"`
	Lines []string `json:"lines"`
}

// RegisterRequest registers an agent's host.
type RegisterRequest struct {
	Report
}

// Report is what an agent observes on its host: the hypervisor's truth
// about what runs there, which the controller's admission, placement and
// DRS count (a VM that runs nowhere holds no reservation).
type Report struct {
	VMs     []string `json:"vms"`     // the policy's VMs running on the host (its inventory)
	Uplinks []string `json:"uplinks"` // uplink names (devices)
	// Since is when the agent first saw each of VMs running (its own
	// start for those that ran before it).
	Since map[string]time.Time `json:"since,omitempty"`
	// Unnamed are running domains the policy does not name: classed as
	// the policy's unnamedVMs setting says.
	Unnamed []string `json:"unnamed,omitempty"`
	// UUIDs are the unnamed domains' UUIDs, by domain name: the controller
	// finds among them the VMs of a policy that names VMs by UUID (a VM
	// placed on another host is unnamed in this host's part).
	UUIDs map[string]string `json:"uuids,omitempty"`
	// Failed are the moves in (DesiredHost.Moves) the host could not
	// carry out, VM → why: the controller records the decision failed.
	Failed map[string]string `json:"failed,omitempty"`
	// RatesBps are measured rates by port (VM/NIC or HOST/CLASS), bits/s.
	RatesBps map[string]float64 `json:"rates_bps,omitempty"`
	// CapacityIOPS are the capacities of datastores as this host measured
	// them (parda.Capacity: what all hosts did in the periods the
	// datastore was congested), by datastore; only those measured.
	CapacityIOPS map[string]float64 `json:"capacity_iops,omitempty"`
	Time         time.Time          `json:"time"`
}

// Lease is a host's registration: heartbeat within TTLSeconds.
type Lease struct {
	ID         int64 `json:"lease_id"`
	TTLSeconds int64 `json:"ttl_s"`
}

// HeartbeatRequest renews a lease; ReportRequest renews it and replaces
// the host's report.
type HeartbeatRequest struct {
	LeaseID int64 `json:"lease_id"`
}

// ReportRequest is a report under a lease.
type ReportRequest struct {
	LeaseID int64  `json:"lease_id"`
	Report  Report `json:"report"`
}

// DesiredHost is the desired state of one host: its part of the policy
// in force (Policy: entitle.HostParts), which its agent and its storage
// gateway enforce with the VMs their hypervisor runs, and what that part
// derives to when every VM placed there runs (Uplinks, Disks, CPU: what
// `sluice alloc` and placement count for the host). Revision is the etcd
// revision at which it last changed; a watch returns when it is larger
// than the one the agent has. A host's desired state changes only when
// its part, its VMs or the moves to it change.
type DesiredHost struct {
	Host     string `json:"host"`
	Revision int64  `json:"revision"` // 0: nothing published yet
	// VMs are the VMs placed on the host (where they should run when they
	// run), in name order: the trees hold their classes, and a VM among
	// them that starts here is enforced at once.
	VMs []string `json:"vms"`
	// Moves are the VMs to migrate in now: each runs on From (as its
	// agent reports) and a decision moves it here. A VM placed here that
	// runs nowhere is off: nothing moves it.
	Moves []Move `json:"moves,omitempty"`
	// Starting are the VMs placed here by a power-on or a move that do not
	// run here yet: they hold their reservations (the agent's admission
	// counts them).
	Starting []string     `json:"starting,omitempty"`
	Uplinks  []WireUplink `json:"uplinks"`
	Disks    []WireDisk   `json:"disks"`
	// CPU is each placed VM's CPU and memory setting.
	CPU []WireCPU `json:"cpu,omitempty"`
	// Policy is the host's part of the policy in force: the host, the VMs
	// placed on it (running or not, each with its host set), and the
	// cluster-wide definitions (classes, pools, port groups, datastores,
	// unnamedVMs), in sluice's policy types. Nil when nothing is
	// published yet.
	Policy *policy.Policy `json:"policy,omitempty"`
}

// Move is a VM to migrate in from the host that runs it.
type Move struct {
	VM   string `json:"vm"`
	From string `json:"from"`
}

// WireCPU is a VM's CPU and memory setting on its host.
type WireCPU struct {
	VM             string `json:"vm"`
	VCPUs          int    `json:"vcpus"`
	ReservationMHz int    `json:"reservation_mhz"`
	Shares         int    `json:"shares"`
	LimitMHz       int    `json:"limit_mhz,omitempty"` // 0: unlimited
	MemoryBytes    int64  `json:"memory_bytes,omitempty"`
}

// WireUplink is entitle.UplinkSpec in JSON.
type WireUplink struct {
	Uplink    string      `json:"uplink"`
	SpeedBps  float64     `json:"speed_bps"`
	UsableBps float64     `json:"usable_bps"`
	Down      bool        `json:"down,omitempty"`
	Classes   []WireClass `json:"classes"`
}

// WireClass is entitle.ClassSpec in JSON.
type WireClass struct {
	Name           string     `json:"name"`
	Class          string     `json:"class"`
	ReservationBps float64    `json:"reservation_bps"`
	Shares         float64    `json:"shares"`
	LimitBps       *float64   `json:"limit_bps"`
	Declared       bool       `json:"declared,omitempty"`
	VNICs          []WireVNIC `json:"vnics,omitempty"`
}

// WireVNIC is entitle.VNICSpec in JSON.
type WireVNIC struct {
	Port           string   `json:"port"`
	ReservationBps float64  `json:"reservation_bps"`
	Shares         float64  `json:"shares"`
	LimitBps       *float64 `json:"limit_bps"`
}

// WireDisk is entitle.DiskSpec (of a disk whose I/O passes this host) in JSON.
type WireDisk struct {
	Name            string   `json:"name"`
	Datastore       string   `json:"datastore"`
	ReservationIOPS float64  `json:"reservation_iops"`
	Shares          float64  `json:"shares"`
	LimitIOPS       *float64 `json:"limit_iops"`
}

func limitPtr(v float64) *float64 {
	if math.IsInf(v, 1) {
		return nil
	}
	return &v
}

func limitOf(p *float64) float64 {
	if p == nil {
		return alloc.Inf
	}
	return *p
}

// desiredOf renders the desired state of the hosts in only (nil: every
// host of p): each host's part of the policy (entitle.HostParts), what it
// derives to with every VM placed there running, and the VMs starting or
// moving in. Each host is derived from its part alone, as its agent and
// gateway derive it: VMs in name order, uplinks and disks in file order.
func desiredOf(p *policy.Policy, place map[string]string, starting map[string]Start, only map[string]bool) map[string]*DesiredHost {
	parts := entitle.HostParts(p, place, only)
	out := make(map[string]*DesiredHost, len(parts))
	for host, part := range parts {
		dh := emptyDesired(host)
		dh.Policy = part
		live := entitle.Live{Hosts: make(map[string]string, len(part.VMs))}
		for i := range part.VMs {
			live.Hosts[part.VMs[i].Name] = host
			dh.VMs = append(dh.VMs, part.VMs[i].Name)
		}
		sort.Strings(dh.VMs)
		for _, vm := range dh.VMs {
			if s, ok := starting[vm]; ok && s.Host == host {
				dh.Starting = append(dh.Starting, vm)
				if s.Move && s.From != "" {
					dh.Moves = append(dh.Moves, Move{VM: vm, From: s.From})
				}
			}
			v := part.VM(vm)
			dh.CPU = append(dh.CPU, WireCPU{VM: vm, VCPUs: v.CPU.VCPUs, ReservationMHz: v.CPU.ReservationMHz, Shares: v.CPU.Shares,
				LimitMHz: v.CPU.LimitMHz, MemoryBytes: int64(v.Memory)})
		}
		d := entitle.Derive(part, live)
		for _, u := range d.Uplinks {
			wu := WireUplink{Uplink: u.Uplink, SpeedBps: u.SpeedBps, UsableBps: u.UsableBps, Down: u.Down}
			for _, c := range u.Classes {
				wc := WireClass{Name: c.Name, Class: c.Class, ReservationBps: c.ReservationBps, Shares: c.Shares,
					LimitBps: limitPtr(c.LimitBps), Declared: c.Declared}
				for _, v := range c.VNICs {
					wc.VNICs = append(wc.VNICs, WireVNIC{Port: v.Port, ReservationBps: v.ReservationBps, Shares: v.Shares, LimitBps: limitPtr(v.LimitBps)})
				}
				wu.Classes = append(wu.Classes, wc)
			}
			dh.Uplinks = append(dh.Uplinks, wu)
		}
		for _, ds := range d.Datastores {
			for _, dk := range ds.Disks {
				dh.Disks = append(dh.Disks, WireDisk{Name: dk.Name, Datastore: ds.Name, ReservationIOPS: dk.ReservationIOPS,
					Shares: dk.Shares, LimitIOPS: limitPtr(dk.LimitIOPS)})
			}
		}
		out[host] = &dh
	}
	return out
}

// emptyDesired is the desired state of a host with nothing on it.
func emptyDesired(host string) DesiredHost {
	return DesiredHost{Host: host, VMs: []string{}, Uplinks: []WireUplink{}, Disks: []WireDisk{}}
}

// UplinkSpecs converts the desired state back to entitle's types, for an
// agent that builds its trees from them.
func (d DesiredHost) UplinkSpecs() []entitle.UplinkSpec {
	var out []entitle.UplinkSpec
	for _, u := range d.Uplinks {
		us := entitle.UplinkSpec{Host: d.Host, Uplink: u.Uplink, SpeedBps: u.SpeedBps, UsableBps: u.UsableBps, Down: u.Down}
		for _, c := range u.Classes {
			cs := entitle.ClassSpec{Name: c.Name, Class: c.Class, ReservationBps: c.ReservationBps, Shares: c.Shares,
				LimitBps: limitOf(c.LimitBps), Declared: c.Declared}
			for _, v := range c.VNICs {
				vm, nic, _ := cutPort(v.Port)
				cs.VNICs = append(cs.VNICs, entitle.VNICSpec{Port: v.Port, VM: vm, NIC: nic, ReservationBps: v.ReservationBps,
					Shares: v.Shares, LimitBps: limitOf(v.LimitBps)})
			}
			us.Classes = append(us.Classes, cs)
		}
		out = append(out, us)
	}
	return out
}

func cutPort(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
