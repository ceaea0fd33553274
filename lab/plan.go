// Package lab builds, lists and removes a live lab of Linux network
// namespaces from a policy file (DESIGN.md §6): a fabric namespace with a
// bridge that stands for the physical switch and holds the clients (iperf3
// and sockperf servers), one namespace per host with a bridge per uplink and
// the uplink veths to the fabric, one namespace per VM whose vNIC is a veth on
// its host's bridge, and one namespace per datastore running nbdkit.
// The datastores are on a storage network of their own (a bridge in the
// storage namespace, a veth to it from each host namespace) that the VMs'
// network does not reach: a VM reaches its disks only through its host's
// gateway (issue 26).
//
// A VM with `lab: {kind: qemu}` is a real QEMU guest under libvirt instead
// (qemu.go): the domain sl-<cluster>-<vm>, whose taps the lab moves onto its
// host's bridge.
//
// Everything the lab creates is named with the prefix `sl-<cluster>-` (for
// namespaces) or `sl-` (for links, which live only inside those namespaces)
// and recorded in a state file, so that Down removes all of it, also after a
// crash and also when the state file is lost. Each VM also gets a CPU
// cgroup of its own named like its namespace (VMCgroup), removed by prefix
// as well.
//
// The lab never programs traffic control: that is the agent's job. The
// naming and addressing functions here (Plan) are the one place both the lab
// and the agent derive device names and addresses from.
package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"sluice/policy"
	"sluice/storage"
)

// Roles of the namespaces of a lab.
const (
	RoleFabric    = "fabric"
	RoleHost      = "host"
	RoleVM        = "vm"
	RoleDatastore = "datastore"
	// RoleStorage is the storage network's namespace: the bridge the
	// hosts and the datastores are on, no address.
	RoleStorage = "storage"
)

// Ports of the servers the lab runs.
const (
	// IperfBasePort is the iperf3 server port of the first vNIC; vNIC k of
	// the lab (in policy order) has a server on IperfBasePort+k in the fabric.
	IperfBasePort = 5201
	// SockperfPort is the port of the sockperf server in the fabric.
	SockperfPort = 11111
	// NBDPort is the port of datastores (nbdkit) and host storage gateways.
	NBDPort = 10809
)

// FabricBridge is the bridge of the fabric namespace.
const FabricBridge = "sl-fabric"

// StorageBridge is the bridge of the storage namespace, the storage
// network's switch; HostStorageDev is each host namespace's veth to it.
const (
	StorageBridge  = "sl-storage"
	HostStorageDev = "sl-st0"
)

// Plan is the deterministic layout of a lab for a policy: names and
// addresses of every namespace and link. The agent uses it to find uplink
// devices and vNIC addresses.
type Plan struct {
	Cluster    string
	Prefix     string // "sl-<cluster>-"
	Fabric     Namespace
	Storage    Namespace // the storage network's bridge (StorageBridge)
	Hosts      []HostPlan
	VMs        []VMPlan
	Datastores []DatastorePlan
}

// Namespace is one network namespace of the lab.
type Namespace struct {
	Name   string     `json:"name"`
	Role   string     `json:"role"`
	Entity string     `json:"entity"` // host, VM or datastore name; "fabric"
	Addrs  []Addr     `json:"addresses"`
	Disks  []DiskPlan `json:"disks,omitempty"`
	// Kind is policy.LabQemu for a VM that is a real QEMU guest: then
	// Name is its libvirt domain, not a network namespace, and Console
	// is its serial console's log.
	Kind    string `json:"kind,omitempty"`
	Console string `json:"console,omitempty"`
}

// Addr is an address of a device of a namespace.
type Addr struct {
	Dev string `json:"dev"`
	IP  string `json:"ip"` // without prefix length (PrefixLen, or StoragePrefixLen on the storage network)
}

// DiskPlan is a VM disk and the URI its host's gateway exports it at.
type DiskPlan struct {
	Name      string `json:"name"`
	Datastore string `json:"datastore"`
	URI       string `json:"uri"`
}

// VolumeDir is the directory of datastore ds's volumes (served by its
// nbdkit) in a lab whose state lives in stateDir.
func VolumeDir(stateDir, cluster, ds string) string {
	return filepath.Join(stateDirOr(stateDir), "lab-"+cluster+".volumes", ds)
}

// NbdkitSocket is the Unix socket of the nbdkit of datastore ds with the
// throttle driver, in a lab whose state lives in stateDir.
func NbdkitSocket(stateDir, cluster, ds string) string {
	return filepath.Join(stateDirOr(stateDir), "lab-"+cluster+"-nbdkit-"+ds+".sock")
}

// useStateDir sets the paths that depend on the state directory: the
// datastores' volume directories.
func (pl *Plan) useStateDir(stateDir string) {
	for i := range pl.Datastores {
		pl.Datastores[i].Array.Dir = VolumeDir(stateDir, pl.Cluster, pl.Datastores[i].Datastore)
		if pl.Datastores[i].Driver == policy.DriverThrottle {
			pl.Datastores[i].Socket = NbdkitSocket(stateDir, pl.Cluster, pl.Datastores[i].Datastore)
		}
	}
	// A throttle datastore's disks are its qcow2 images on nbdkit's socket.
	for i := range pl.VMs {
		for k, d := range pl.VMs[i].Disks {
			if ds := pl.datastore(d.Datastore); ds != nil && ds.Driver == policy.DriverThrottle {
				pl.VMs[i].Disks[k].URI = fmt.Sprintf("nbd+unix:///%s?socket=%s", ThrottleVolume(pl.VMs[i].VM, d.Name), ds.Socket)
			}
		}
	}
}

// HostPlan is a host namespace.
type HostPlan struct {
	Namespace
	Host    string
	IP      netip.Addr // on the bridge of the first uplink
	Uplinks []UplinkPlan
	// StorageIP is the host's address on the storage network, on its
	// veth HostStorageDev whose peer StoragePeer is a port of
	// StorageBridge: the gateway reaches the datastores from it.
	StorageIP   netip.Addr
	StoragePeer string
}

// UplinkPlan is one uplink of a host: a bridge in the host namespace and a
// veth from it to the fabric bridge. The agent's HTB tree sits on Dev.
type UplinkPlan struct {
	Name      string // the policy's uplink name
	Dev       string // in the host namespace, a port of Bridge
	Bridge    string // in the host namespace
	FabricDev string // the peer, in the fabric namespace
	SpeedBps  policy.Bps
}

// VMPlan is a VM namespace.
type VMPlan struct {
	Namespace
	VM   string
	Host string
	NICs []NICPlan
}

// NICPlan is one vNIC: a veth from the VM namespace to a host bridge.
//
// For a QEMU guest (VMPlan.Kind policy.LabQemu), Dev is the guest's
// ethN and HostDev its tap: libvirt creates the tap as Tap in the root
// namespace, and the lab moves it into the host namespace as HostDev.
type NICPlan struct {
	Name      string // the policy's NIC name
	Port      string // "VM/NIC"
	Dev       string // in the VM namespace
	HostDev   string // the peer, in the host namespace, a port of Bridge
	Bridge    string
	Uplink    string // the policy's uplink name it sends through
	IP        netip.Addr
	IP6       netip.Addr // ULA, on the same device (PrefixLen6)
	IperfPort int        // the iperf3 server for this vNIC in the fabric (IPv4 and IPv6); a guest runs its own on this port too
	GlobalIdx int
	Tap       string // QEMU guests: the tap's name in the root namespace, "sl-t" + 8 hex digits
	MAC       string // the VM's MAC address on Dev (a guest's, or the namespace VM's end of the veth)
}

// DatastorePlan is a datastore namespace running nbdkit, on the storage
// network only.
type DatastorePlan struct {
	Namespace
	Datastore string
	IP        netip.Addr // on the storage network, where nbdkit listens
	Dev       string
	// StorageDev is Dev's peer, a port of StorageBridge in the storage
	// namespace.
	StorageDev string
	// Array is the emulated device (storage.ArrayOf the policy's array):
	// its slots shared by every host's connections.
	Array storage.Array
	// Driver is how the lab controls the datastore's disks: the gateway
	// (the lab prepares the datastore as `sluice datastore create` does:
	// volumes the gateway serves) unless the policy says throttle; then
	// the guests open qcow2 images (ThrottleVolume) straight from nbdkit
	// on Socket, and no gateway serves them.
	Driver string
	// Socket is nbdkit's Unix socket of a throttle datastore (the guests'
	// QEMU runs outside the lab's namespaces).
	Socket string
}

// ThrottleVolume is the qcow2 image of disk DISK of VM VM on a lab
// datastore with the throttle driver: its file in the datastore's
// directory and its export name on nbdkit.
func ThrottleVolume(vm, disk string) string {
	return strings.TrimSuffix(storage.VolumeName(vm, disk), ".img") + ".qcow2"
}

// FabricIP is the address of the fabric bridge, where the clients listen.
var FabricIP = netip.AddrFrom4([4]byte{198, 18, 0, 1})

// PrefixLen is the prefix length of the addresses of the VMs' network
// (198.18.0.0/16: the fabric, the hosts' uplink bridges and the vNICs, one
// L2 segment through the bridges). It leaves out the storage network
// (198.19.0.0/16), so that a VM has no route to it.
const PrefixLen = 16

// StoragePrefixLen is the prefix length of the storage network's
// addresses, 198.19.0.0/16: host i has 198.19.1.(i+1), datastore j
// 198.19.2.(j+1). Only the host namespaces and the datastores are on it.
const StoragePrefixLen = 16

// FabricIP6 is the fabric bridge's IPv6 address. The lab's IPv6 addresses
// are unique local ones in fd00:198:18::/64 (PrefixLen6), on the fabric
// bridge and the VMs' vNICs, inside the lab's namespaces only: vNIC k has
// fd00:198:18::1:(k+1).
var FabricIP6 = netip.MustParseAddr("fd00:198:18::1")

// PrefixLen6 is the prefix length of the lab's IPv6 addresses.
const PrefixLen6 = 64

func nicIP6(k int) netip.Addr {
	b := FabricIP6.As16()
	b[13], b[14], b[15] = 1, byte((k+1)>>8), byte(k+1)
	return netip.AddrFrom16(b)
}

// NamespacePrefix is the prefix of every namespace of a cluster's lab.
func NamespacePrefix(cluster string) string { return "sl-" + cluster + "-" }

// NewPlan derives the layout of the lab of p. It fails when the policy is
// too large for the address plan or a VM has no host.
func NewPlan(p *policy.Policy) (*Plan, error) {
	if len(p.Hosts) > 250 || len(p.Datastores) > 250 {
		return nil, fmt.Errorf("lab: at most 250 hosts and 250 datastores")
	}
	pre := NamespacePrefix(p.Cluster)
	pl := &Plan{Cluster: p.Cluster, Prefix: pre}
	pl.Fabric = Namespace{Name: pre + "fabric", Role: RoleFabric, Entity: "fabric",
		Addrs: []Addr{{Dev: FabricBridge, IP: FabricIP.String()}}}
	pl.Storage = Namespace{Name: pre + "storage", Role: RoleStorage, Entity: "storage"}
	hostIdx := map[string]int{}
	for i, h := range p.Hosts {
		hp := HostPlan{Host: h.Name, IP: netip.AddrFrom4([4]byte{198, 18, 1, byte(i + 1)}),
			StorageIP: netip.AddrFrom4([4]byte{198, 19, 1, byte(i + 1)}), StoragePeer: fmt.Sprintf("sl-h%ds", i)}
		hp.Namespace = Namespace{Name: pre + h.Name, Role: RoleHost, Entity: h.Name}
		for k, u := range h.Uplinks {
			hp.Uplinks = append(hp.Uplinks, UplinkPlan{
				Name: u.Name, Dev: fmt.Sprintf("sl-up%d", k), Bridge: fmt.Sprintf("sl-br%d", k),
				FabricDev: fmt.Sprintf("sl-h%du%d", i, k), SpeedBps: u.Speed,
			})
		}
		if len(hp.Uplinks) > 0 {
			hp.Addrs = []Addr{{Dev: hp.Uplinks[0].Bridge, IP: hp.IP.String()}}
		}
		hp.Addrs = append(hp.Addrs, Addr{Dev: HostStorageDev, IP: hp.StorageIP.String()})
		hostIdx[h.Name] = i
		pl.Hosts = append(pl.Hosts, hp)
	}
	for j, d := range p.Datastores {
		// One volume file per disk in the datastore's directory
		// (useStateDir), served by nbdkit's file plugin.
		dp := DatastorePlan{Datastore: d.Name, IP: netip.AddrFrom4([4]byte{198, 19, 2, byte(j + 1)}),
			Dev: "sl-eth0", StorageDev: fmt.Sprintf("sl-d%d", j), Array: storage.ArrayOf(d.Array, ""),
			Driver: p.Datastores[j].DriverAt(true)} // the lab prepares it: the gateway's unless the file says throttle
		dp.Namespace = Namespace{Name: pre + d.Name, Role: RoleDatastore, Entity: d.Name,
			Addrs: []Addr{{Dev: dp.Dev, IP: dp.IP.String()}}}
		pl.Datastores = append(pl.Datastores, dp)
	}
	k := 0
	for vi, vm := range p.VMs {
		hi, ok := hostIdx[vm.Host]
		if !ok {
			return nil, fmt.Errorf("lab: VM %s has no host (place it first)", vm.Name)
		}
		hp := &pl.Hosts[hi]
		if len(hp.Uplinks) == 0 {
			return nil, fmt.Errorf("lab: host %s has no uplink", hp.Host)
		}
		vp := VMPlan{VM: vm.Name, Host: vm.Host}
		vp.Namespace = Namespace{Name: pre + vm.Name, Role: RoleVM, Entity: vm.Name}
		guest := vm.Lab.Kind == policy.LabQemu
		if guest {
			vp.Kind = policy.LabQemu
		}
		for ni, n := range vm.NICs {
			if k >= 250*200 {
				return nil, fmt.Errorf("lab: too many vNICs")
			}
			up := hp.Uplinks[0]
			want := p.NICUplink(&p.VMs[vi], &p.VMs[vi].NICs[ni])
			for _, u := range hp.Uplinks {
				if u.Name == want {
					up = u
				}
			}
			// 198.18.16.1 onwards: k < 250×200 keeps it in 198.18.0.0/16.
			ip := netip.AddrFrom4([4]byte{198, 18, byte(16 + k/250), byte(k%250 + 1)})
			np := NICPlan{Name: n.Name, Port: policy.PortName(vm.Name, n.Name),
				Dev: fmt.Sprintf("sl-eth%d", ni), HostDev: fmt.Sprintf("sl-v%dn%d", vi, ni),
				Bridge: up.Bridge, Uplink: up.Name, IP: ip, IP6: nicIP6(k), IperfPort: IperfBasePort + k, GlobalIdx: k}
			np.MAC = fmt.Sprintf("52:54:00:51:%02x:%02x", k>>8, k&0xff)
			if guest {
				np.Dev = fmt.Sprintf("eth%d", ni)
				np.Tap = tapName(p.Cluster, np.Port)
			}
			vp.NICs = append(vp.NICs, np)
			vp.Addrs = append(vp.Addrs, Addr{Dev: np.Dev, IP: ip.String()})
			k++
		}
		for _, dk := range vm.Disks {
			// The VM's own socket on its host's gateway (docs/storage.md,
			// "Access control"): reachable without a vNIC.
			vp.Disks = append(vp.Disks, DiskPlan{Name: dk.Name, Datastore: dk.Datastore,
				URI: fmt.Sprintf("nbd+unix:///%s/%s?socket=%s", vm.Name, dk.Name, storage.VMSocket(storage.SocketDir(p.Cluster, hp.Host), vm.Name))})
		}
		pl.VMs = append(pl.VMs, vp)
	}
	pl.useStateDir("")
	// A policy name may be the lab's own ("fabric", "storage") or
	// another entity's: each namespace must be one thing.
	seen := map[string]string{}
	for _, ns := range pl.Namespaces() {
		what := ns.Role + " " + ns.Entity
		if ns.Role == RoleFabric || ns.Role == RoleStorage {
			what = "the lab's " + ns.Role + " network"
		}
		if prev, ok := seen[ns.Name]; ok {
			return nil, fmt.Errorf("lab: namespace %s would be both %s and %s: rename the %s", ns.Name, prev, what, ns.Role)
		}
		seen[ns.Name] = what
	}
	return pl, nil
}

// Host returns the plan of the named host, or nil.
func (pl *Plan) Host(name string) *HostPlan {
	for i := range pl.Hosts {
		if pl.Hosts[i].Host == name {
			return &pl.Hosts[i]
		}
	}
	return nil
}

// VM returns the plan of the named VM, or nil.
func (pl *Plan) VM(name string) *VMPlan {
	for i := range pl.VMs {
		if pl.VMs[i].VM == name {
			return &pl.VMs[i]
		}
	}
	return nil
}

// NIC returns the plan of the port "VM/NIC", or nil.
func (pl *Plan) NIC(port string) *NICPlan {
	for i := range pl.VMs {
		for j := range pl.VMs[i].NICs {
			if pl.VMs[i].NICs[j].Port == port {
				return &pl.VMs[i].NICs[j]
			}
		}
	}
	return nil
}

// Namespaces lists every namespace of the plan: fabric, storage,
// datastores, hosts, VMs, in that order (the order they are created in).
func (pl *Plan) Namespaces() []Namespace {
	out := []Namespace{pl.Fabric, pl.Storage}
	for _, d := range pl.Datastores {
		out = append(out, d.Namespace)
	}
	for _, h := range pl.Hosts {
		out = append(out, h.Namespace)
	}
	for _, v := range pl.VMs {
		out = append(out, v.Namespace)
	}
	return out
}

// UplinkTxQueueLen is the transmit queue length of uplink devices, which
// HTB gives each leaf class's packet FIFO. The default (1000) lets a class
// throttled by HTB queue seconds of traffic; TCP then needs seconds to
// follow a change of its rate. TCP sizes its GSO packets to about 1 ms of
// its rate, so 64 packets hold tens of milliseconds at any rate.
const UplinkTxQueueLen = 64
