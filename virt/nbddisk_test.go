package virt

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNBDDiskXML(t *testing.T) {
	d := NBDDisk{Export: "vm1/d0", Socket: "/run/sluice/gw-h1.sock", Target: "vda", Serial: "d0", ReconnectDelayS: 30}
	want := `<disk type='network' device='disk'>
  <driver name='qemu' type='raw'/>
  <source protocol='nbd' name='vm1/d0'>
    <host transport='unix' socket='/run/sluice/gw-h1.sock'/>
    <reconnect delay='30'/>
  </source>
  <target dev='vda' bus='virtio'/>
  <serial>d0</serial>
</disk>
`
	if got := d.DiskXML(); got != want {
		t.Errorf("DiskXML:\n%s\nwant\n%s", got, want)
	}
	tcp := NBDDisk{Export: "vm'1/d0", Host: "198.18.1.1", Port: 10809, Target: "vdb"}
	if got := tcp.DiskXML(); !strings.Contains(got, "<host name='198.18.1.1' port='10809'/>") ||
		!strings.Contains(got, "name='vm&apos;1/d0'") || strings.Contains(got, "reconnect") {
		t.Errorf("TCP disk without reconnect delay:\n%s", got)
	}
}

func TestNBDDiskQemuArgs(t *testing.T) {
	d := NBDDisk{Export: "vm1/d0", Socket: "/run/s.sock", Serial: "a,b", ReconnectDelayS: 7}
	a := d.QemuArgs(0x18)
	if len(a) != 4 || a[0] != "-blockdev" || a[2] != "-device" {
		t.Fatalf("QemuArgs = %q", a)
	}
	var bd struct {
		Driver, NodeName, Export string
		Reconnect                int               `json:"reconnect-delay"`
		Server                   map[string]string `json:"server"`
	}
	if err := json.Unmarshal([]byte(a[1]), &bd); err != nil {
		t.Fatal(err)
	}
	if bd.Driver != "nbd" || bd.Export != "vm1/d0" || bd.Reconnect != 7 || bd.Server["type"] != "unix" || bd.Server["path"] != "/run/s.sock" {
		t.Errorf("blockdev %s", a[1])
	}
	if want := "virtio-blk-pci,drive=sl-disk24,id=sl-disk24,bus=pci.0,addr=0x18,serial=a,,b"; a[3] != want {
		t.Errorf("device %q, want %q", a[3], want)
	}
	x := CommandlineXML([]NBDDisk{d}, 0x18)
	if !strings.HasPrefix(x, "<qemu:commandline>\n  <qemu:arg value='-blockdev'/>\n  <qemu:arg value='{\"") {
		t.Errorf("CommandlineXML:\n%s", x)
	}
}

func TestTargetName(t *testing.T) {
	for i, want := range map[int]string{0: "vda", 1: "vdb", 25: "vdz", 26: "vdaa", 27: "vdab", 701: "vdzz", 702: "vdaaa"} {
		if got := TargetName(i); got != want {
			t.Errorf("TargetName(%d) = %s, want %s", i, got, want)
		}
	}
}
