package virt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sluice/agent"
)

// pciXML is a PCI <address> of libvirt's XML, each part in hex
// (domain='0x0000' bus='0x03' slot='0x10' function='0x1').
type pciXML struct {
	Type     string `xml:"type,attr"`
	Domain   string `xml:"domain,attr"`
	Bus      string `xml:"bus,attr"`
	Slot     string `xml:"slot,attr"`
	Function string `xml:"function,attr"`
}

// addr is the address as sysfs names it (0000:03:10.1), or "" when it
// is no complete PCI address.
func (a pciXML) addr() string {
	if a.Type != "" && a.Type != "pci" {
		return ""
	}
	var v [4]uint64
	for i, s := range []string{a.Domain, a.Bus, a.Slot, a.Function} {
		if i == 0 && s == "" {
			continue // domain 0 when absent
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 16)
		if err != nil {
			return ""
		}
		v[i] = n
	}
	if v[1] > 0xff || v[2] > 0x1f || v[3] > 7 {
		return ""
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3])
}

// SysfsVF finds the SR-IOV virtual function at PCI address pci under the
// sysfs root (DefaultSysfs; tests give a tree of their own): its PF's
// network device (the one entry of physfn/net/) and its index N on the
// PF (the PF's virtfnN link that points at it).
func SysfsVF(root, pci string) (agent.VF, error) {
	vf := agent.VF{PCI: pci}
	dev := filepath.Join(root, "bus", "pci", "devices", pci)
	if _, err := os.Stat(dev); err != nil {
		return vf, fmt.Errorf("PCI device %s: %w", pci, err)
	}
	pf := filepath.Join(dev, "physfn")
	if _, err := os.Stat(pf); err != nil {
		return vf, fmt.Errorf("PCI device %s is no SR-IOV virtual function (no physfn)", pci)
	}
	nets, err := os.ReadDir(filepath.Join(pf, "net"))
	if err != nil || len(nets) == 0 {
		return vf, fmt.Errorf("the PF of VF %s has no network device (physfn/net)", pci)
	}
	names := make([]string, 0, len(nets))
	for _, n := range nets {
		names = append(names, n.Name())
	}
	sort.Strings(names)
	vf.PF = names[0]
	links, err := filepath.Glob(filepath.Join(pf, "virtfn*"))
	if err != nil {
		return vf, err
	}
	for _, l := range links {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(l), "virtfn"))
		if err != nil {
			continue
		}
		if t, err := os.Readlink(l); err == nil && filepath.Base(t) == pci {
			vf.Index = n
			return vf, nil
		}
	}
	return vf, fmt.Errorf("VF %s is not among the virtfn links of its PF %s", pci, vf.PF)
}

// DefaultSysfs is where sysfs is mounted.
const DefaultSysfs = "/sys"

// ErrNoVF is wrapped by VF's error for a port that is no passthrough PCI
// device of a running domain.
var ErrNoVF = errors.New("no passthrough PCI device")

// VF finds the SR-IOV virtual function that the port VM/NIC uses: the
// PCI address libvirt gives for it (an <interface type='hostdev'>, or a
// hostdev pool's interface, matched as Port matches; else a <hostdev>
// whose alias is ua-NIC), mapped through sysfs (Config.Sysfs) to its PF
// device and VF index.
func (inv *Inventory) VF(port string) (agent.VF, error) {
	vm, nic, found := strings.Cut(port, "/")
	if !found || vm == "" || nic == "" {
		return agent.VF{}, fmt.Errorf("%s: %w", port, ErrNoVF)
	}
	inv.mu.Lock()
	pci := ""
	d := inv.lookupLocked(vm)
	if d != nil {
		if i, ok := matchNIC(d.Interfaces, nic); ok {
			pci = d.Interfaces[i].PCI
		}
		for _, h := range d.HostDevs {
			if pci == "" && h.Alias == "ua-"+nic {
				pci = h.PCI
			}
		}
	}
	inv.mu.Unlock()
	switch {
	case d == nil:
		return agent.VF{}, fmt.Errorf("%s: domain %s does not run: %w", port, vm, ErrNoVF)
	case pci == "":
		return agent.VF{}, fmt.Errorf("%s: domain %s has no interface type='hostdev' nor <hostdev> with alias ua-%s: %w", port, d.Name, nic, ErrNoVF)
	}
	root := inv.cfg.Sysfs
	if root == "" {
		root = DefaultSysfs
	}
	vf, err := SysfsVF(root, pci)
	if err != nil {
		return vf, fmt.Errorf("%s: %w", port, err)
	}
	return vf, nil
}
