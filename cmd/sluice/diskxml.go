package main

import (
	"fmt"
	"io"
	"strings"

	"sluice/storage"
	"sluice/virt"
)

const diskXMLUsage = "usage: sluice gateway disk-xml --policy FILE --host H [--socket-dir DIR] [--reconnect-delay 30] [--form disk|qemu] VM/DISK"

// runGatewayDiskXML prints the libvirt XML that attaches a VM's disk to
// its host's gateway (docs/storage.md, "QEMU").
func runGatewayDiskXML(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gateway disk-xml")
	pol := fs.String("policy", "", "policy file (required)")
	host := fs.String("host", "", "the host whose gateway serves the disk (required)")
	socketDir := fs.String("socket-dir", "", "the gateway's --socket-dir (default "+statusDir+"/gw-CLUSTER-HOST): the disk is on the VM's own socket DIR/VM.sock")
	delay := fs.Int("reconnect-delay", virt.DefaultReconnectDelayS, "seconds QEMU holds requests while it reconnects to the gateway (0: fail them at once)")
	form := fs.String("form", "disk", "disk: a libvirt <disk> element; qemu: a <qemu:commandline> element (for libvirt 9.0, which drops the reconnect delay)")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	if *pol == "" || *host == "" || fs.NArg() != 1 || (*form != "disk" && *form != "qemu") {
		fmt.Fprintln(stderr, diskXMLUsage)
		return exitUsage
	}
	if *delay < 0 {
		fmt.Fprintln(stderr, "sluice gateway disk-xml: --reconnect-delay must be ≥ 0")
		return exitUsage
	}
	d := virt.NBDDisk{Export: fs.Arg(0), ReconnectDelayS: *delay}
	if *socketDir != "" && !strings.HasPrefix(*socketDir, "/") {
		fmt.Fprintf(stderr, "sluice gateway disk-xml: --socket-dir %s: want an absolute path (QEMU opens it)\n", *socketDir)
		return exitBad
	}
	p, code := loadPolicy(*pol, stderr)
	if p == nil {
		return code
	}
	vmName, diskName, ok := strings.Cut(d.Export, "/")
	if !ok || vmName == "" || diskName == "" {
		fmt.Fprintf(stderr, "sluice gateway disk-xml: %q: want VM/DISK\n", d.Export)
		return exitUsage
	}
	if p.Host(*host) == nil {
		fmt.Fprintf(stderr, "sluice gateway disk-xml: no host %q in %s\n", *host, *pol)
		return exitBad
	}
	for _, vm := range p.VMs {
		if vm.Name != vmName {
			continue
		}
		if vm.Host != *host {
			fmt.Fprintf(stderr, "sluice gateway disk-xml: VM %s is on host %q, not %s: its disks are served by its own host's gateway\n", vmName, vm.Host, *host)
			return exitBad
		}
		for i, dk := range vm.Disks {
			if dk.Name != diskName {
				continue
			}
			dir := *socketDir
			if dir == "" {
				dir = storage.SocketDir(p.Cluster, *host)
			}
			d.Socket, d.Target, d.Serial = storage.VMSocket(dir, vmName), virt.TargetName(i), dk.Name
			if *form == "qemu" {
				fmt.Fprintf(stdout, "<!-- the <domain> element needs xmlns:qemu='%s' -->\n%s", virt.QemuNamespace, virt.CommandlineXML([]virt.NBDDisk{d}, 0x18+i))
			} else {
				fmt.Fprint(stdout, d.DiskXML())
			}
			return exitOK
		}
		fmt.Fprintf(stderr, "sluice gateway disk-xml: VM %s has no disk %q\n", vmName, diskName)
		return exitBad
	}
	fmt.Fprintf(stderr, "sluice gateway disk-xml: no VM %q in %s\n", vmName, *pol)
	return exitBad
}
