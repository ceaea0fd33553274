// Package virt is the agent's inventory of a libvirt (KVM/QEMU) host: the
// running domains, each interface's host-side device, MAC and bridge, their
// disks, vCPUs and cgroup, kept current by libvirt's lifecycle events. It
// implements agent.Inventory. It only reads from libvirt: it never starts,
// stops or changes a domain, and it touches no kernel state.
package virt

import (
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"
)

// Domain is what the inventory knows of one running domain, from its live
// XML.
type Domain struct {
	Name       string
	UUID       string
	VCPUs      int // current vCPUs
	Interfaces []Interface
	// HostDevs are the domain's PCI <hostdev> devices.
	HostDevs []HostDev
	Disks    []Disk
	// Partition is the resource partition libvirt placed the domain in
	// (<resource><partition>, e.g. /machine); empty when it reports none.
	Partition string
	// Cgroup is the domain's cgroup directory (under /sys/fs/cgroup) as
	// Config.Cgroup resolved it; empty when unknown.
	Cgroup string
}

// Interface is one of a domain's network interfaces.
type Interface struct {
	Type   string // bridge, network, direct, ethernet, ...
	Dev    string // host-side device: vnetN tap, macvtapN; empty for types without one
	MAC    string // lower case, 52:54:00:...
	Bridge string // the bridge the tap is on (bridge and network types)
	// Source is the lower device of a direct (macvtap) interface.
	Source string
	Alias  string // libvirt alias, e.g. ua-nic0 or net0
	Model  string // virtio, e1000, ...
	// PCI is the host PCI address (0000:03:10.1) of a passthrough
	// interface (type hostdev, or a network of a hostdev pool, whose live
	// XML gives the device it took): an SR-IOV VF; empty otherwise.
	PCI string
}

// HostDev is a PCI device of a domain given with <hostdev> (not as an
// interface): when it is an SR-IOV VF, the policy names it as a vNIC by
// its user alias (ua-NIC).
type HostDev struct {
	PCI   string // host PCI address, 0000:03:10.1
	Alias string
}

// Disk is one of a domain's disks.
type Disk struct {
	Target string // guest device, e.g. vda
	Source string // file, block device, or protocol:name of a network disk
	Bus    string
	Alias  string
	Serial string // <serial>; the policy's disk name when sluice wrote the XML
}

type domainXML struct {
	Name string `xml:"name"`
	UUID string `xml:"uuid"`
	VCPU struct {
		Current string `xml:"current,attr"`
		Value   string `xml:",chardata"`
	} `xml:"vcpu"`
	Resource struct {
		Partition string `xml:"partition"`
	} `xml:"resource"`
	Devices struct {
		Interfaces []struct {
			Type string `xml:"type,attr"`
			MAC  struct {
				Address string `xml:"address,attr"`
			} `xml:"mac"`
			Source struct {
				Bridge  string `xml:"bridge,attr"`
				Network string `xml:"network,attr"`
				Dev     string `xml:"dev,attr"`
				Address pciXML `xml:"address"`
			} `xml:"source"`
			Target struct {
				Dev string `xml:"dev,attr"`
			} `xml:"target"`
			Alias struct {
				Name string `xml:"name,attr"`
			} `xml:"alias"`
			Model struct {
				Type string `xml:"type,attr"`
			} `xml:"model"`
		} `xml:"interface"`
		HostDevs []struct {
			Type   string `xml:"type,attr"`
			Source struct {
				Address pciXML `xml:"address"`
			} `xml:"source"`
			Alias struct {
				Name string `xml:"name,attr"`
			} `xml:"alias"`
		} `xml:"hostdev"`
		Disks []struct {
			Device string `xml:"device,attr"`
			Source struct {
				File     string `xml:"file,attr"`
				Dev      string `xml:"dev,attr"`
				Protocol string `xml:"protocol,attr"`
				Name     string `xml:"name,attr"`
				Volume   string `xml:"volume,attr"`
			} `xml:"source"`
			Target struct {
				Dev string `xml:"dev,attr"`
				Bus string `xml:"bus,attr"`
			} `xml:"target"`
			Alias struct {
				Name string `xml:"name,attr"`
			} `xml:"alias"`
			Serial string `xml:"serial"`
		} `xml:"disk"`
	} `xml:"devices"`
}

// ParseDomainXML reads a domain's live XML (virsh dumpxml).
func ParseDomainXML(b []byte) (Domain, error) {
	var x domainXML
	if err := xml.Unmarshal(b, &x); err != nil {
		return Domain{}, fmt.Errorf("domain XML: %w", err)
	}
	if x.Name == "" {
		return Domain{}, fmt.Errorf("domain XML: no <name>")
	}
	d := Domain{Name: x.Name, UUID: strings.ToLower(x.UUID), Partition: x.Resource.Partition}
	v := x.VCPU.Current
	if v == "" {
		v = strings.TrimSpace(x.VCPU.Value)
	}
	if v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return Domain{}, fmt.Errorf("domain XML %s: vcpu %q: %w", x.Name, v, err)
		}
		d.VCPUs = n
	}
	for _, i := range x.Devices.Interfaces {
		d.Interfaces = append(d.Interfaces, Interface{
			Type: i.Type, Dev: i.Target.Dev, MAC: strings.ToLower(i.MAC.Address),
			Bridge: i.Source.Bridge, Source: i.Source.Dev, Alias: i.Alias.Name, Model: i.Model.Type,
			PCI: i.Source.Address.addr(),
		})
	}
	for _, h := range x.Devices.HostDevs {
		if a := h.Source.Address.addr(); h.Type == "pci" && a != "" {
			d.HostDevs = append(d.HostDevs, HostDev{PCI: a, Alias: h.Alias.Name})
		}
	}
	for _, k := range x.Devices.Disks {
		if k.Device != "" && k.Device != "disk" {
			continue // cdrom, floppy, lun
		}
		src := k.Source.File
		switch {
		case src != "":
		case k.Source.Dev != "":
			src = k.Source.Dev
		case k.Source.Protocol != "":
			src = k.Source.Protocol + ":" + k.Source.Name
		case k.Source.Volume != "":
			src = k.Source.Volume
		}
		d.Disks = append(d.Disks, Disk{Target: k.Target.Dev, Source: src, Bus: k.Target.Bus, Alias: k.Alias.Name, Serial: strings.TrimSpace(k.Serial)})
	}
	return d, nil
}
