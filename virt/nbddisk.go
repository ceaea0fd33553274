package virt

import (
	"encoding/json"
	"fmt"
	"strings"
)

// NBDDisk is a VM disk that QEMU reads and writes over NBD from its host's
// storage gateway (sluice gateway): the export VM/DISK on the gateway's
// Unix socket (or TCP address), seen by the guest as a virtio-blk disk.
type NBDDisk struct {
	// Export is the gateway's export name, "VM/DISK".
	Export string
	// Socket is the gateway's Unix socket; when empty, Host and Port
	// (TCP) are used.
	Socket string
	Host   string
	Port   int
	// Target is the guest device name libvirt gives the disk ("vda").
	Target string
	// Serial is what the guest reads in /sys/block/vdX/serial (at most 20
	// bytes are kept by virtio-blk); the disk's name by convention.
	Serial string
	// ReconnectDelayS is QEMU's NBD reconnect-delay in seconds: after the
	// connection to the gateway is lost, requests wait up to this long
	// for QEMU to reconnect and are then sent again on the new
	// connection; 0 fails them at once (the guest sees I/O errors).
	ReconnectDelayS int
	// Format is the image format QEMU reads from the export: "" or raw
	// (a gateway's export), qcow2 (an image file served as is).
	Format string
}

// DefaultReconnectDelayS is the reconnect delay sluice proposes: longer
// than a gateway's restart by a supervisor (about a second) and than the
// gateway's own retrying of a datastore that went away (15 s), so that
// neither shows in the guest as an I/O error.
const DefaultReconnectDelayS = 30

// DiskXML is the libvirt <disk> element of d. libvirt keeps the
// <reconnect delay='N'/> of an NBD source only in releases newer than 9.0;
// 9.0 drops it without an error (check with `virsh dumpxml`), and QEMU
// then fails the requests in flight when the gateway restarts. For such a
// libvirt use CommandlineXML instead.
func (d NBDDisk) DiskXML() string {
	var b strings.Builder
	b.WriteString("<disk type='network' device='disk'>\n")
	format := d.Format
	if format == "" {
		format = "raw"
	}
	fmt.Fprintf(&b, "  <driver name='qemu' type='%s'/>\n", attr(format))
	fmt.Fprintf(&b, "  <source protocol='nbd' name='%s'>\n", attr(d.Export))
	if d.Socket != "" {
		fmt.Fprintf(&b, "    <host transport='unix' socket='%s'/>\n", attr(d.Socket))
	} else {
		fmt.Fprintf(&b, "    <host name='%s' port='%d'/>\n", attr(d.Host), d.Port)
	}
	if d.ReconnectDelayS > 0 {
		fmt.Fprintf(&b, "    <reconnect delay='%d'/>\n", d.ReconnectDelayS)
	}
	b.WriteString("  </source>\n")
	fmt.Fprintf(&b, "  <target dev='%s' bus='virtio'/>\n", attr(d.Target))
	if d.Serial != "" {
		fmt.Fprintf(&b, "  <serial>%s</serial>\n", attr(d.Serial))
	}
	b.WriteString("</disk>\n")
	return b.String()
}

// QemuNamespace is the XML namespace of libvirt's QEMU command-line
// passthrough; a domain using CommandlineXML declares it on <domain>
// (xmlns:qemu='...').
const QemuNamespace = "http://libvirt.org/schemas/domain/qemu/1.0"

// QemuArgs are the QEMU arguments that attach d without libvirt's disk
// model, with its reconnect delay: a -blockdev of the nbd driver and a
// virtio-blk-pci device on PCI slot slot of bus pci.0 (an explicit slot:
// QEMU creates passthrough devices before libvirt's, whose slots libvirt
// numbers from 2; choose one libvirt does not use, e.g. 0x18 and up).
// libvirt does not list such a disk (virsh domblklist).
func (d NBDDisk) QemuArgs(slot int) []string {
	node := fmt.Sprintf("sl-disk%d", slot) // unique in the domain; QEMU allows 31 characters
	server := map[string]any{"type": "unix", "path": d.Socket}
	if d.Socket == "" {
		server = map[string]any{"type": "inet", "host": d.Host, "port": fmt.Sprint(d.Port)}
	}
	bd, _ := json.Marshal(map[string]any{"driver": "nbd", "node-name": node, "server": server,
		"export": d.Export, "reconnect-delay": d.ReconnectDelayS, "discard": "unmap"})
	dev := fmt.Sprintf("virtio-blk-pci,drive=%s,id=%s,bus=pci.0,addr=0x%x", node, node, slot)
	if d.Serial != "" {
		dev += ",serial=" + strings.ReplaceAll(d.Serial, ",", ",,")
	}
	return []string{"-blockdev", string(bd), "-device", dev}
}

// CommandlineXML is the <qemu:commandline> element attaching disks with
// QemuArgs, disk i on PCI slot firstSlot+i.
func CommandlineXML(disks []NBDDisk, firstSlot int) string {
	var b strings.Builder
	b.WriteString("<qemu:commandline>\n")
	for i, d := range disks {
		for _, a := range d.QemuArgs(firstSlot + i) {
			fmt.Fprintf(&b, "  <qemu:arg value='%s'/>\n", attr(a))
		}
	}
	b.WriteString("</qemu:commandline>\n")
	return b.String()
}

// attr escapes s for an XML attribute in single quotes.
func attr(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&apos;").Replace(s)
}

// TargetName is the guest device name of a VM's i-th virtio disk: vda,
// vdb, …, vdz, vdaa, ….
func TargetName(i int) string {
	s := ""
	for i++; i > 0; i = (i - 1) / 26 {
		s = string(rune('a'+(i-1)%26)) + s
	}
	return "vd" + s
}
