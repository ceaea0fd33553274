package lab

import (
	"strings"
	"testing"

	"sluice/policy"
)

const guestHosts = `cluster: c1
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}, {name: up1, speed: 1Gbps}]
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, nics: [{name: nic0}, {name: nic1}]}
  - {name: vm2, host: h1, nics: [{name: nic0}]}
`

// migratableXML is the shape of libvirt 9's migratable XML of a lab
// guest on its first host (ethernet taps) with a third interface that is
// not the VM's.
const migratableXML = `<domain type='qemu'>
  <name>sl-c1-vm1</name>
  <devices>
    <interface type='ethernet'>
      <mac address='%s'/>
      <target dev='sl-t00000001' managed='yes'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/>
    </interface>
    <interface type='bridge'>
      <mac address='%s'/>
      <source bridge='sl-br0'/>
      <target dev='sl-v0n1'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/>
    </interface>
    <interface type='ethernet'>
      <mac address='52:54:00:ff:ff:ff'/>
      <model type='virtio'/>
    </interface>
  </devices>
</domain>`

// TestDestXML checks the guest's XML on the destination: each of its
// vNICs (found by MAC, whatever its type on the source) is a bridge
// interface on the destination host's bridge of its uplink with the tap
// named as the agent expects (HostDev); its model and PCI address, and
// the other interface, are unchanged.
func TestDestXML(t *testing.T) {
	p, err := policy.Parse("c1.yaml", []byte(guestHosts))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	v := pl.VM("vm1")
	x := strings.Replace(migratableXML, "%s", strings.ToUpper(v.NICs[0].MAC), 1)
	x = strings.Replace(x, "%s", v.NICs[1].MAC, 1)
	got, err := pl.destXML(x, v, pl.Host("h2"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range v.NICs {
		br := ""
		for _, u := range pl.Host("h2").Uplinks {
			if u.Name == n.Uplink {
				br = u.Bridge
			}
		}
		want := "<interface type='bridge'>\n      <source bridge='" + br + "'/>\n      <target dev='" + n.HostDev + "'/>"
		if !strings.Contains(got, want) {
			t.Errorf("vNIC %d: no %q in\n%s", i, want, got)
		}
	}
	for _, keep := range []string{"slot='0x03'", "slot='0x04'", "<interface type='ethernet'>\n      <mac address='52:54:00:ff:ff:ff'/>"} {
		if !strings.Contains(got, keep) {
			t.Errorf("%q lost:\n%s", keep, got)
		}
	}
	if strings.Count(got, "<target dev=") != 2 || strings.Contains(got, "sl-t00000001") || strings.Count(got, "<source ") != 2 {
		t.Errorf("old taps or sources left:\n%s", got)
	}
	if _, err := pl.destXML(strings.Replace(x, v.NICs[1].MAC, "52:54:00:00:00:99", 1), v, pl.Host("h2")); err == nil ||
		err.Error() != "lab: the XML of sl-c1-vm1 has 1 of its 2 vNICs (by MAC)" {
		t.Errorf("a vNIC missing from the XML: error %v", err)
	}
}
