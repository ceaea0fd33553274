package virt

import (
	"reflect"
	"testing"
)

// A live XML as libvirt 9 writes it, trimmed: a bridge tap, a macvtap, a
// network-type tap, a file disk, a network disk and a cdrom.
const liveXML = `<domain type='kvm' id='7'>
  <name>web1</name>
  <uuid>6F1D0C2E-8A4B-4C1E-9D0F-2B3C4D5E6F70</uuid>
  <vcpu placement='static' current='2'>4</vcpu>
  <resource><partition>/machine</partition></resource>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/lib/libvirt/images/web1.qcow2' index='2'/>
      <target dev='vda' bus='virtio'/><alias name='virtio-disk0'/>
    </disk>
    <disk type='network' device='disk'>
      <source protocol='rbd' name='pool/web1-data'/>
      <target dev='vdb' bus='virtio'/><alias name='virtio-disk1'/>
    </disk>
    <disk type='file' device='cdrom'><target dev='sda' bus='sata'/></disk>
    <interface type='bridge'>
      <mac address='52:54:00:AB:CD:01'/><source bridge='br0'/><target dev='vnet3'/>
      <model type='virtio'/><alias name='ua-nic0'/>
    </interface>
    <interface type='direct'>
      <mac address='52:54:00:ab:cd:02'/><source dev='eno1' mode='bridge'/><target dev='macvtap0'/>
      <model type='virtio'/><alias name='net1'/>
    </interface>
    <interface type='network'>
      <mac address='52:54:00:ab:cd:03'/><source network='default' bridge='virbr0'/><target dev='vnet4'/>
      <model type='e1000'/><alias name='net2'/>
    </interface>
  </devices>
</domain>`

func TestParseDomainXML(t *testing.T) {
	d, err := ParseDomainXML([]byte(liveXML))
	if err != nil {
		t.Fatal(err)
	}
	want := Domain{
		Name: "web1", UUID: "6f1d0c2e-8a4b-4c1e-9d0f-2b3c4d5e6f70", VCPUs: 2, Partition: "/machine",
		Interfaces: []Interface{
			{Type: "bridge", Dev: "vnet3", MAC: "52:54:00:ab:cd:01", Bridge: "br0", Alias: "ua-nic0", Model: "virtio"},
			{Type: "direct", Dev: "macvtap0", MAC: "52:54:00:ab:cd:02", Source: "eno1", Alias: "net1", Model: "virtio"},
			{Type: "network", Dev: "vnet4", MAC: "52:54:00:ab:cd:03", Bridge: "virbr0", Alias: "net2", Model: "e1000"},
		},
		Disks: []Disk{
			{Target: "vda", Source: "/var/lib/libvirt/images/web1.qcow2", Bus: "virtio", Alias: "virtio-disk0"},
			{Target: "vdb", Source: "rbd:pool/web1-data", Bus: "virtio", Alias: "virtio-disk1"},
		},
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("got  %+v\nwant %+v", d, want)
	}
}

func TestParseDomainXMLErrors(t *testing.T) {
	for _, x := range []string{"", "<domain>", "<domain><uuid>x</uuid></domain>", "<domain><name>a</name><vcpu>two</vcpu></domain>"} {
		if _, err := ParseDomainXML([]byte(x)); err == nil {
			t.Errorf("ParseDomainXML(%q): no error", x)
		}
	}
}

func TestCgroupDir(t *testing.T) {
	for _, c := range []struct{ proc, want string }{
		{"12:cpu,cpuacct:/machine/qemu-1-web1.libvirt-qemu/emulator\n0::/\n", "/sys/fs/cgroup/cpu/machine/qemu-1-web1.libvirt-qemu"},
		{"0::/machine.slice/machine-qemu\\x2d1\\x2dweb1.scope/libvirt/emulator\n", "/sys/fs/cgroup/machine.slice/machine-qemu\\x2d1\\x2dweb1.scope/libvirt"},
		{"3:memory:/x\n", ""},
	} {
		if got := cgroupDir(c.proc, "/sys/fs/cgroup"); got != c.want {
			t.Errorf("cgroupDir(%q) = %q, want %q", c.proc, got, c.want)
		}
	}
}
