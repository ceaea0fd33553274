package lab

import (
	"net/netip"
	"strings"
	"testing"

	"sluice/policy"
)

const twoHosts = `cluster: c1
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}, {name: up1, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - {name: ds1, array: {slots: 4, serviceTime: 2ms}}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0}, {name: nic1, uplink: up1}], disks: [{name: d0, datastore: ds1, size: 64MiB}]}
  - {name: vm2, host: h2, nics: [{name: nic0}]}
`

// TestPlan checks the names and addresses the lab and the agent share:
// every namespace carries the cluster prefix, every link the sl- prefix
// and fits IFNAMSIZ, addresses are unique and inside 198.18.0.0/15, and
// disk URIs point at the host's gateway.
func TestPlan(t *testing.T) {
	p, err := policy.Parse("c1.yaml", []byte(twoHosts))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	seenIP := map[string]bool{}
	for _, ns := range pl.Namespaces() {
		if !strings.HasPrefix(ns.Name, "sl-c1-") {
			t.Errorf("namespace %s lacks the prefix", ns.Name)
		}
		for _, a := range ns.Addrs {
			if !strings.HasPrefix(a.Dev, "sl-") || len(a.Dev) > 15 {
				t.Errorf("device %s: want sl- prefix and ≤ 15 bytes", a.Dev)
			}
			if seenIP[a.IP] || !(strings.HasPrefix(a.IP, "198.18.") || strings.HasPrefix(a.IP, "198.19.")) {
				t.Errorf("address %s duplicate or outside 198.18.0.0/15", a.IP)
			}
			seenIP[a.IP] = true
		}
		got = append(got, ns.Role+":"+ns.Name)
	}
	want := "fabric:sl-c1-fabric storage:sl-c1-storage datastore:sl-c1-ds1 host:sl-c1-h1 host:sl-c1-h2 vm:sl-c1-vm1 vm:sl-c1-vm2"
	if strings.Join(got, " ") != want {
		t.Errorf("namespaces\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if n := pl.NIC("vm1/nic1"); n == nil || n.Bridge != "sl-br1" || n.Uplink != "up1" {
		t.Errorf("vm1/nic1 should be on up1's bridge sl-br1: %+v", n)
	}
	if d := pl.VM("vm1").Disks; len(d) != 1 || d[0].URI != "nbd+unix:///vm1/d0?socket=/run/sluice/gw-c1-h1/vm1.sock" {
		t.Errorf("disk URI: %+v", d)
	}
	// 4 slots × 2 ms per 4 KiB I/O: 2000 IOPS shared by all hosts.
	args := strings.Join(pl.Datastores[0].Array.NbdkitArgs(), " ")
	if want := "-t 64 --filter=rate --filter=delay file dir=/run/sluice/lab-c1.volumes/ds1 rate=65536000 burstiness=0.1 rdelay=2ms wdelay=2ms"; args != want {
		t.Errorf("datastore nbdkit args\n got %s\nwant %s", args, want)
	}
}

// TestStorageNetwork (issue 26): the datastores are on the storage
// network only, with the hosts' storage veths; no address of it is inside
// the VMs' network, so a VM has no route to a datastore; a policy name
// that is one of the lab's own namespaces is refused.
func TestStorageNetwork(t *testing.T) {
	p, err := policy.Parse("c1.yaml", []byte(twoHosts))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	vmNet := netip.PrefixFrom(FabricIP, PrefixLen).Masked()
	storageNet := netip.MustParsePrefix("198.19.0.0/16")
	var storageIPs []netip.Addr
	for _, h := range pl.Hosts {
		storageIPs = append(storageIPs, h.StorageIP)
		if !vmNet.Contains(h.IP) {
			t.Errorf("host %s's uplink address %s outside the VMs' network %s", h.Host, h.IP, vmNet)
		}
	}
	for _, d := range pl.Datastores {
		storageIPs = append(storageIPs, d.IP)
	}
	for _, a := range storageIPs {
		if !storageNet.Contains(a) || netip.PrefixFrom(a, StoragePrefixLen).Masked() != storageNet {
			t.Errorf("storage address %s/%d: want it in %s", a, StoragePrefixLen, storageNet)
		}
		for _, v := range pl.VMs {
			for _, n := range v.NICs {
				if !vmNet.Contains(n.IP) || netip.PrefixFrom(n.IP, PrefixLen).Contains(a) {
					t.Errorf("%s's vNIC %s/%d: want it in %s, without the storage address %s", n.Port, n.IP, PrefixLen, vmNet, a)
				}
			}
		}
	}
	want := `-n sl-c1-storage link add sl-storage type bridge
-n sl-c1-storage link set sl-storage up
-n sl-c1-storage link add sl-d0 type veth peer name sl-eth0 netns sl-c1-ds1
-n sl-c1-storage link set sl-d0 master sl-storage up
-n sl-c1-ds1 addr add 198.19.2.1/16 dev sl-eth0
-n sl-c1-ds1 link set sl-eth0 up
-n sl-c1-storage link add sl-h0s type veth peer name sl-st0 netns sl-c1-h1
-n sl-c1-storage link set sl-h0s master sl-storage up
-n sl-c1-h1 addr add 198.19.1.1/16 dev sl-st0
-n sl-c1-h1 link set sl-st0 up
-n sl-c1-storage link add sl-h1s type veth peer name sl-st0 netns sl-c1-h2
-n sl-c1-storage link set sl-h1s master sl-storage up
-n sl-c1-h2 addr add 198.19.1.2/16 dev sl-st0
-n sl-c1-h2 link set sl-st0 up`
	if got := strings.Join(pl.storageLines(), "\n"); got != want {
		t.Errorf("storage network:\n%s\nwant:\n%s", got, want)
	}
	for _, name := range []string{"storage", "fabric", "h1"} {
		clash := strings.Replace(twoHosts, "name: vm2,", "name: "+name+",", 1)
		p, err := policy.Parse("c1.yaml", []byte(clash))
		if err != nil {
			t.Fatalf("VM %s: %v", name, err)
		}
		if _, err := NewPlan(p); err == nil || !strings.Contains(err.Error(), "sl-c1-"+name) {
			t.Errorf("VM named %s: NewPlan error %v, want the namespace named", name, err)
		}
	}
}

// TestMoveLines: a namespace VM moves by taking its host-side veths to
// the destination's namespace and its bridge of the same uplink (or the
// first); a move in place only re-attaches; unknown names are errors.
func TestMoveLines(t *testing.T) {
	p, err := policy.Parse("c1.yaml", []byte(twoHosts))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pl.MoveLines("vm1", "h1", "h2")
	if err != nil {
		t.Fatal(err)
	}
	want := `-n sl-c1-h1 link set sl-v0n0 netns sl-c1-h2
-n sl-c1-h2 link set sl-v0n0 master sl-br0 up
-n sl-c1-h1 link set sl-v0n1 netns sl-c1-h2
-n sl-c1-h2 link set sl-v0n1 master sl-br0 up`
	if strings.Join(got, "\n") != want {
		t.Fatalf("move vm1 h1→h2:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	got, _ = pl.MoveLines("vm2", "h2", "h1")
	if strings.Join(got, "\n") != "-n sl-c1-h2 link set sl-v1n0 netns sl-c1-h1\n-n sl-c1-h1 link set sl-v1n0 master sl-br0 up" {
		t.Fatalf("move vm2 h2→h1: %q", got)
	}
	if got, _ = pl.MoveLines("vm2", "h2", "h2"); len(got) != 1 {
		t.Fatalf("move in place: %q", got)
	}
	for _, c := range [][3]string{{"vm9", "h1", "h2"}, {"vm1", "h1", "h9"}, {"vm1", "h9", "h2"}} {
		if _, err := pl.MoveLines(c[0], c[1], c[2]); err == nil {
			t.Errorf("move %v: no error", c)
		}
	}
}

// TestPlanGuestDisks: a guest's disks are on its own socket of its host's
// gateway (QEMU runs in the root namespace); its domain attaches them as
// virtio disks vda, vdb with the reconnect delay, as <disk> elements or
// as QEMU arguments.
func TestPlanGuestDisks(t *testing.T) {
	p, err := policy.Parse("g.yaml", []byte(`cluster: g1
hosts:
  - {name: h1, uplinks: [{name: up0, speed: 1Gbps}]}
datastores: [{name: ds1}]
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, disks: [{name: a, datastore: ds1}, {name: b, datastore: ds1}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	sock := "/run/sluice/gw-g1-h1/vm1.sock"
	if d := pl.VM("vm1").Disks; d[1].URI != "nbd+unix:///vm1/b?socket="+sock {
		t.Errorf("vm1/b URI %s", d[1].URI)
	}
	x := domainXML(*pl.VM("vm1"), "/boot/k", "/run/i", "/run/c", guestDisks(pl, *pl.VM("vm1")), false, Options{})
	for _, want := range []string{"<source protocol='nbd' name='vm1/b'>", "<host transport='unix' socket='" + sock + "'/>",
		"<reconnect delay='30'/>", "<target dev='vdb' bus='virtio'/>", "<serial>b</serial>", "<acpi/>"} {
		if !strings.Contains(x, want) {
			t.Errorf("domain XML lacks %s:\n%s", want, x)
		}
	}
	x = domainXML(*pl.VM("vm1"), "/boot/k", "/run/i", "/run/c", guestDisks(pl, *pl.VM("vm1")), true, Options{})
	for _, want := range []string{"xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'", "&#34;reconnect-delay&#34;:30", "addr=0x19,serial=b"} {
		if !strings.Contains(x, strings.ReplaceAll(want, "&#34;", "\"")) {
			t.Errorf("passthrough domain XML lacks %s:\n%s", want, x)
		}
	}
	if strings.Contains(x, "<disk ") {
		t.Errorf("passthrough domain XML still has <disk>:\n%s", x)
	}
}
