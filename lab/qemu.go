package lab

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/policy"
	"sluice/storage"
	"sluice/virt"
)

// A VM with `lab: {kind: qemu}` is a real QEMU guest under the machine's
// libvirtd: a domain named like the VM's namespace would be
// (sl-<cluster>-<vm>), booting the host's kernel with the initramfs of
// WriteInitramfs, its root the host's filesystem over 9p (read-only, tmpfs
// on /tmp and /run). Each vNIC is an <interface type='ethernet'>: libvirt
// creates its tap (NICPlan.Tap) in the root namespace and hands it to QEMU;
// the lab then moves the tap into the host's namespace, renames it to
// NICPlan.HostDev and makes it a port of the vNIC's bridge. QEMU keeps
// using the tap through its file descriptor. The guest configures its
// addresses and starts an iperf3 server on the vNIC's IperfPort (the
// kernel command line carries them, GuestScript reads them).

// GuestMemoryMiB and GuestVCPUs size every lab guest: enough for iperf3,
// sockperf and fio on the host's root (the policy's memory and vCPUs are
// what the scheduler reserves, not what the guest is given).
const (
	GuestMemoryMiB = 256
	GuestVCPUs     = 1
)

// GuestBootTimeout bounds how long Up waits for the guests to say they are
// ready (measured: 3–6 s for one TCG guest, ~10 s for three at once on 2
// vCPUs).
const GuestBootTimeout = 90 * time.Second

// tapName is the root-namespace name of a guest vNIC's tap: unique per
// cluster and port, at most 15 characters.
func tapName(cluster, port string) string {
	h := fnv.New32a()
	h.Write([]byte(cluster + "\x00" + port))
	return fmt.Sprintf("sl-t%08x", h.Sum32())
}

// HasGuests tells whether the plan has a QEMU guest.
func (pl *Plan) HasGuests() bool {
	for _, v := range pl.VMs {
		if v.Kind == policy.LabQemu {
			return true
		}
	}
	return false
}

// guestConsole is the serial console log of a guest.
func guestConsole(stateDir, cluster, vm string) string {
	return filepath.Join(stateDirOr(stateDir), "lab-"+cluster+"-guest-"+vm+".log")
}

// guestInitrd is the initramfs the cluster's guests boot.
func guestInitrd(stateDir, cluster string) string {
	return filepath.Join(stateDirOr(stateDir), "lab-"+cluster+"-initrd")
}

// guestDisks are the NBD disks of a guest: each of its disks from the
// guest's own socket on its host's gateway (storage.VMSocket), vda, vdb, … in policy order, serial = disk name.
//
// A disk on a datastore with the throttle driver is the disk's qcow2 image
// (ThrottleVolume) straight from the datastore's nbdkit socket, as a
// libvirt <disk> whose throttle libvirt sets; no gateway, no reconnect
// delay.
func guestDisks(pl *Plan, v VMPlan) []virt.NBDDisk {
	sock := storage.VMSocket(storage.SocketDir(pl.Cluster, v.Host), v.VM)
	var out []virt.NBDDisk
	for i, d := range v.Disks {
		if ds := pl.datastore(d.Datastore); ds != nil && ds.Driver == policy.DriverThrottle {
			out = append(out, virt.NBDDisk{Export: ThrottleVolume(v.VM, d.Name), Socket: ds.Socket, Format: "qcow2",
				Target: virt.TargetName(i), Serial: d.Name})
			continue
		}
		out = append(out, virt.NBDDisk{Export: v.VM + "/" + d.Name, Socket: sock,
			Target: virt.TargetName(i), Serial: d.Name, ReconnectDelayS: virt.DefaultReconnectDelayS})
	}
	return out
}

// datastore is the plan of datastore name, or nil.
func (pl *Plan) datastore(name string) *DatastorePlan {
	for i := range pl.Datastores {
		if pl.Datastores[i].Datastore == name {
			return &pl.Datastores[i]
		}
	}
	return nil
}

// firstDiskSlot is the PCI slot of a guest's first disk when its disks are
// passed to QEMU directly (virt.CommandlineXML): above the slots libvirt
// gives the guest's own devices.
const firstDiskSlot = 0x18

// domainXML is the libvirt domain of a guest VM. Its disks are libvirt
// <disk> elements, or, with passthrough, QEMU arguments
// (virt.CommandlineXML) for a libvirt that drops the NBD reconnect delay.
func domainXML(v VMPlan, kernel, initrd, console string, disks []virt.NBDDisk, passthrough bool, o Options) string {
	typ, cpu := "qemu", "<cpu mode='maximum' check='none'/>"
	if o.KVM {
		typ, cpu = "kvm", "<cpu mode='host-passthrough' check='none'/>"
	}
	// no_timer_check: on a busy machine a TCG guest's timer check at boot fails
	// ("IO-APIC + timer doesn't work!") and the kernel panics.
	cmd := []string{"console=ttyS0", "quiet", "panic=-1", "no_timer_check"}
	var ifs strings.Builder
	for _, n := range v.NICs {
		ip4 := fmt.Sprintf("%s/%d", n.IP, PrefixLen)
		if o.GuestIPv6Only[v.VM] {
			ip4 = ""
		}
		cmd = append(cmd, fmt.Sprintf("sl.net=%s,%s,%s/%d", n.Dev, ip4, n.IP6, PrefixLen6),
			fmt.Sprintf("sl.iperf=%d", n.IperfPort))
		fmt.Fprintf(&ifs, `    <interface type='ethernet'>
      <target dev='%s' managed='yes'/>
      <mac address='%s'/>
      <model type='virtio'/>
    </interface>
`, n.Tap, n.MAC)
	}
	if o.GuestTTL > 0 {
		cmd = append(cmd, fmt.Sprintf("sl.ttl=%d", int(o.GuestTTL.Seconds())))
	}
	ns, qemuArgs := "", ""
	// With passthrough the gateway's disks (those with a reconnect delay)
	// go to QEMU as arguments; a throttle datastore's disks stay libvirt
	// disks, whose throttle libvirt sets.
	var args []virt.NBDDisk
	for _, d := range disks {
		if passthrough && d.ReconnectDelayS > 0 {
			args = append(args, d)
			continue
		}
		ifs.WriteString(d.DiskXML())
	}
	if len(args) > 0 {
		ns = " xmlns:qemu='" + virt.QemuNamespace + "'"
		qemuArgs = virt.CommandlineXML(args, firstDiskSlot)
	}
	return fmt.Sprintf(`<domain type='%s'%s>
  <name>%s</name>
  <memory unit='MiB'>%d</memory>
  <vcpu>%d</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>%s</cmdline>
  </os>
  %s
  <features><acpi/><apic/></features>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <filesystem type='mount' accessmode='passthrough' multidevs='remap'>
      <source dir='/'/>
      <target dir='%s'/>
      <readonly/>
    </filesystem>
%s    <channel type='unix'>
      <source mode='bind'/>
      <target type='virtio' name='%s'/>
    </channel>
    <serial type='file'>
      <source path='%s'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
%s</domain>`, typ, ns, v.Name, GuestMemoryMiB, GuestVCPUs, kernel, initrd, strings.Join(cmd, " "), cpu, GuestRootTag, ifs.String(), GuestAgentPort, console, qemuArgs)
}

// checkGuestTools says what a lab with guests is missing.
func checkGuestTools(o Options) (kernel, modDir string, err error) {
	if err := libvirtdRuns(); err != nil {
		return "", "", fmt.Errorf("lab: a VM of kind qemu needs libvirtd running (%v; scripts/deps.sh installs and starts it)", err)
	}
	if o.FirmwareBoot {
		return HostKernel()
	}
	return GuestKernel()
}

// libvirtdRuns tells whether something accepts on the machine's libvirtd
// socket (a socket file left by a libvirtd that stopped refuses).
func libvirtdRuns() error {
	c, err := net.DialTimeout("unix", virt.DefaultSocket, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// startGuests defines and starts the plan's guests, recording each domain
// in the state before it is defined, and moves their taps onto their
// hosts' bridges. It does not wait for them to boot (waitGuests).
func startGuests(pl *Plan, st *State, o Options, logw io.Writer) error {
	kernel, modDir, err := checkGuestTools(o)
	if err != nil {
		return err
	}
	initrd := guestInitrd(o.StateDir, pl.Cluster)
	if err := WriteInitramfs(initrd, modDir); err != nil {
		return fmt.Errorf("lab: guest initramfs: %w", err)
	}
	c, err := virt.Dial("")
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer c.Close()
	l := c.Client()
	for _, v := range pl.VMs {
		if v.Kind != policy.LabQemu {
			continue
		}
		console := guestConsole(o.StateDir, pl.Cluster, v.VM)
		_ = os.Remove(console)
		st.Domains = append(st.Domains, v.Name)
		if err := writeState(o.StateDir, st); err != nil {
			return err
		}
		vInitrd := initrd
		if o.Migratable[v.VM] {
			if vInitrd, err = migratableInitrd(o.StateDir, pl.Cluster, modDir); err != nil {
				return err
			}
		}
		disks := guestDisks(pl, v)
		dom, err := l.DomainDefineXML(domainXML(v, kernel, vInitrd, console, disks, false, o))
		if err != nil {
			return fmt.Errorf("lab: define domain %s: %w", v.Name, err)
		}
		if slices.ContainsFunc(disks, func(d virt.NBDDisk) bool { return d.ReconnectDelayS > 0 }) {
			// libvirt 9.0 drops the NBD reconnect delay without an error:
			// then the disks go to QEMU as arguments.
			x, err := l.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
			if err != nil {
				return fmt.Errorf("lab: domain %s: %w", v.Name, err)
			}
			if !strings.Contains(x, "<reconnect ") {
				if err := l.DomainUndefineFlags(dom, 0); err != nil {
					return fmt.Errorf("lab: undefine domain %s: %w", v.Name, err)
				}
				if dom, err = l.DomainDefineXML(domainXML(v, kernel, vInitrd, console, disks, true, o)); err != nil {
					return fmt.Errorf("lab: define domain %s: %w", v.Name, err)
				}
				fmt.Fprintf(logw, "guest %s: this libvirt drops the NBD reconnect delay; its disks are QEMU arguments\n", v.VM)
			}
		}
		if err := l.DomainCreate(dom); err != nil {
			return fmt.Errorf("lab: start domain %s: %w", v.Name, err)
		}
		if err := attachGuest(st, v); err != nil {
			return err
		}
		hostNS := pl.Prefix + v.Host
		var lines []string
		for _, n := range v.NICs {
			lines = append(lines,
				fmt.Sprintf("link set %s netns %s", n.Tap, hostNS),
				fmt.Sprintf("-n %s link set %s name %s", hostNS, n.Tap, n.HostDev),
				fmt.Sprintf("-n %s link set %s master %s up", hostNS, n.HostDev, n.Bridge))
		}
		if err := batch(lines); err != nil {
			return fmt.Errorf("lab: tap of %s: %w", v.Name, err)
		}
		fmt.Fprintf(logw, "guest %s started (domain %s)\n", v.VM, v.Name)
	}
	return nil
}

// waitGuests waits until every guest of the plan says on its console that
// its servers listen.
func waitGuests(pl *Plan, stateDir string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, v := range pl.VMs {
		if v.Kind != policy.LabQemu {
			continue
		}
		console := guestConsole(stateDir, pl.Cluster, v.VM)
		for {
			b, _ := os.ReadFile(console)
			if strings.Contains(string(b), "sl-guest: ready") {
				break
			}
			if time.Now().After(deadline) {
				s := string(b)
				if len(s) > 1500 {
					s = s[len(s)-1500:]
				}
				return fmt.Errorf("lab: guest %s not ready after %v; console %s ends:\n%s", v.VM, within, console, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// ExistingDomains lists the libvirt domains (running or defined) with the
// cluster's prefix; nil when libvirtd does not run.
func ExistingDomains(cluster string) ([]string, error) {
	if libvirtdRuns() != nil {
		return nil, nil // no libvirtd, no running domain
	}
	c, err := virt.Dial("")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	doms, _, err := c.Client().ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range doms {
		if strings.HasPrefix(d.Name, NamespacePrefix(cluster)) {
			out = append(out, d.Name)
		}
	}
	return out, nil
}

// domainActive tells whether the named domain runs (under the machine's
// libvirtd or, after a migration, a lab host's own).
func domainActive(name string) bool {
	return systemDomainActive(name) || hostLibvirtdActive(name)
}

func systemDomainActive(name string) bool {
	c, err := virt.Dial("")
	if err != nil {
		return false
	}
	defer c.Close()
	d, err := c.Client().DomainLookupByName(name)
	if err != nil {
		return false
	}
	a, err := c.Client().DomainIsActive(d)
	return err == nil && a == 1
}

// removeDomains destroys and undefines the cluster's domains, found by
// prefix (also after a crash) and from the state. Destroying a guest ends
// its QEMU, which deletes its tap.
func removeDomains(cluster string, recorded []string) error {
	if err := libvirtdRuns(); err != nil {
		if len(recorded) > 0 {
			return fmt.Errorf("lab: libvirtd does not run (%v), cannot remove domains %v", err, recorded)
		}
		return nil
	}
	c, err := virt.Dial("")
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer c.Close()
	l := c.Client()
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return fmt.Errorf("lab: list domains: %w", err)
	}
	var errs []error
	for _, d := range doms {
		if !strings.HasPrefix(d.Name, NamespacePrefix(cluster)) {
			continue
		}
		if a, _ := l.DomainIsActive(d); a == 1 {
			if err := l.DomainDestroy(d); err != nil && !isNoDomain(err) {
				errs = append(errs, fmt.Errorf("destroy %s: %w", d.Name, err))
			}
		}
		if err := l.DomainUndefineFlags(d, 0); err != nil && !isNoDomain(err) {
			errs = append(errs, fmt.Errorf("undefine %s: %w", d.Name, err))
		}
	}
	return errors.Join(errs...)
}

func isNoDomain(err error) bool {
	return libvirt.IsNotFound(err) || strings.Contains(err.Error(), "not running")
}
