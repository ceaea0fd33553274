// Package nicinfo reads what a network device's NIC is: its driver, link
// speed and duplex, queues (RSS channels) and offloads (TSO, GSO, GRO, LRO,
// checksums), as `ethtool -i`, `ethtool`, `-l` and `-k` show them. It asks
// the kernel through ethtool netlink (generic netlink family "ethtool":
// LINKMODES_GET, CHANNELS_GET, FEATURES_GET with verbose bitsets, which
// carry the features' names), the driver through the ETHTOOL_GDRVINFO
// ioctl (ethtool netlink has no drvinfo) and the queue counts through
// rtnetlink.
//
// It only reads: it changes nothing on the device. What a device does not
// support (lo and an IFB have neither link modes nor channels) is unknown
// in Info, not an error. Parsing the kernel's replies
// (parse.go) is pure and tested on recorded and constructed bytes; the
// Reader is the one part that talks to the kernel.
package nicinfo

import (
	"fmt"
	"strings"
)

// Info is what the kernel says about one device's NIC.
type Info struct {
	Dev string `json:"dev"`
	// Driver, DriverVersion, FirmwareVersion and BusInfo are `ethtool
	// -i`'s driver, version, firmware-version and bus-info ("": unknown
	// or empty).
	Driver          string `json:"driver,omitempty"`
	DriverVersion   string `json:"driver_version,omitempty"`
	FirmwareVersion string `json:"firmware_version,omitempty"`
	BusInfo         string `json:"bus_info,omitempty"`
	// SpeedBps is the link speed the driver reports (ethtool's Speed),
	// bits/s; 0: unknown (not supported, or no link).
	SpeedBps int64 `json:"speed_bps,omitempty"`
	// Duplex is "full" or "half"; "": unknown.
	Duplex string `json:"duplex,omitempty"`
	// TxQueues and RxQueues are the transmit and receive queues the
	// device has (rtnetlink's numtxqueues and numrxqueues, as `ip -d
	// link` shows them): a multi-queue NIC's kernel default root qdisc
	// is mq, with one child qdisc per TX queue.
	TxQueues int `json:"tx_queues"`
	RxQueues int `json:"rx_queues"`
	// Channels are the device's RSS channels (`ethtool -l`); nil:
	// unknown (the driver does not report them).
	Channels *Channels `json:"channels,omitempty"`
	// Offloads are the offloads of OffloadNames that the kernel knows,
	// in that order; nil: unknown.
	Offloads []Offload `json:"offloads,omitempty"`
	// Unknown names what the device does not report, each with the
	// kernel's reason: "speed (not supported)", "channels (not
	// supported)", "driver (…)", "offloads (…)".
	Unknown []string `json:"unknown,omitempty"`
}

// Channels are a device's queue channels as `ethtool -l` shows them: the
// current counts and the maxima ("Pre-set maximums"); a maximum of 0 is
// ethtool's "n/a" (the driver has no channels of that kind).
type Channels struct {
	RX          uint32 `json:"rx"`
	TX          uint32 `json:"tx"`
	Other       uint32 `json:"other"`
	Combined    uint32 `json:"combined"`
	MaxRX       uint32 `json:"max_rx"`
	MaxTX       uint32 `json:"max_tx"`
	MaxOther    uint32 `json:"max_other"`
	MaxCombined uint32 `json:"max_combined"`
}

// Offload is one offload as `ethtool -k` shows its legacy line (e.g.
// tcp-segmentation-offload): on when any of the kernel features it
// groups is active; fixed when none of them can be changed (not in the
// device's hw features, or in its nochange set). Requested marks one that
// is off although some of its features were asked for (ethtool's
// "[requested on]": the device keeps them off, as a tap does until QEMU
// sets its offloads).
type Offload struct {
	// Name is `ethtool -K`'s keyword for it: tso, gso, gro, lro, rx
	// (receive checksums), tx (transmit checksums).
	Name      string `json:"name"`
	On        bool   `json:"on"`
	Fixed     bool   `json:"fixed,omitempty"`
	Requested bool   `json:"requested,omitempty"`
}

// offloadGroup is one of ethtool's legacy offload flags: the kernel
// features (netdev_features_strings) it stands for.
type offloadGroup struct {
	name    string // ethtool -K's keyword
	label   string // for people
	ethtool string // ethtool -k's line
	match   func(feature string) bool
}

// offloadGroups are the offloads Info reports, in OffloadNames order.
var offloadGroups = []offloadGroup{
	{"tso", "TSO", "tcp-segmentation-offload", func(f string) bool {
		return strings.HasPrefix(f, "tx-tcp") && strings.HasSuffix(f, "-segmentation")
	}},
	{"gso", "GSO", "generic-segmentation-offload", equals("tx-generic-segmentation")},
	{"gro", "GRO", "generic-receive-offload", equals("rx-gro")},
	{"lro", "LRO", "large-receive-offload", equals("rx-lro")},
	{"rx", "RX checksum", "rx-checksumming", equals("rx-checksum")},
	{"tx", "TX checksum", "tx-checksumming", func(f string) bool { return strings.HasPrefix(f, "tx-checksum-") }},
}

func equals(name string) func(string) bool { return func(f string) bool { return f == name } }

// OffloadNames are the offloads Info reports, by `ethtool -K`'s keyword.
func OffloadNames() []string {
	out := make([]string, len(offloadGroups))
	for i, g := range offloadGroups {
		out[i] = g.name
	}
	return out
}

// ethtoolLine is the line of `ethtool -k` that shows the offload named
// name (tso: "tcp-segmentation-offload"); "" for an unknown name.
func ethtoolLine(name string) string {
	for _, g := range offloadGroups {
		if g.name == name {
			return g.ethtool
		}
	}
	return ""
}

// Label is how people name the offload: TSO, GSO, GRO, LRO, RX checksum,
// TX checksum.
func (o Offload) Label() string {
	for _, g := range offloadGroups {
		if g.name == o.Name {
			return g.label
		}
	}
	return o.Name
}

// Offload returns the offload named name (OffloadNames); false when it is
// unknown.
func (i Info) Offload(name string) (Offload, bool) {
	for _, o := range i.Offloads {
		if o.Name == name {
			return o, true
		}
	}
	return Offload{}, false
}

// costly are the offloads whose absence costs CPU per Gbps (seed 001:
// without TSO the host segments in software, "the CPU used is almost
// doubled"; without receive aggregation every MTU-sized packet climbs the
// stack alone), with what it costs.
var costly = []struct{ name, cost string }{
	{"tso", "the kernel cuts every TCP segment to MTU size in software, so CPU per Gbps sent rises (seed 001: almost doubled)"},
	{"gso", "every packet goes down the stack MTU-sized, so CPU per Gbps sent rises (seed 001)"},
	{"gro", "received segments are not merged, every MTU-sized packet climbs the stack alone, so CPU per Gbps received rises (seed 001)"},
}

// Warnings are one line for each of TSO, GSO and GRO that is off on the
// device, naming the offload, what it costs and how to turn it on (or
// that the driver cannot). Nil when all are on or the offloads are
// unknown.
func (i Info) Warnings() []string {
	var out []string
	for _, c := range costly {
		o, ok := i.Offload(c.name)
		if !ok || o.On {
			continue
		}
		fix := fmt.Sprintf("`ethtool -K %s %s on` turns it on", i.Dev, o.Name)
		switch {
		case o.Fixed:
			fix = "the driver cannot turn it on"
		case o.Requested:
			fix = "it is requested on, but the device keeps it off"
		}
		out = append(out, fmt.Sprintf("%s is off on %s: %s; %s", o.Label(), i.Dev, c.cost, fix))
	}
	return out
}

// Summary is the NIC in one line, unknown fields as "?": driver and
// version, speed and duplex, queues and channels, offloads.
func (i Info) Summary() string {
	var b strings.Builder
	drv := i.Driver
	if drv == "" {
		drv = "?"
	} else if i.DriverVersion != "" {
		drv += " " + i.DriverVersion
	}
	fmt.Fprintf(&b, "driver %s", drv)
	if i.SpeedBps > 0 {
		fmt.Fprintf(&b, ", %s", FormatSpeed(i.SpeedBps))
	} else {
		b.WriteString(", speed ?")
	}
	if i.Duplex != "" {
		fmt.Fprintf(&b, " %s duplex", i.Duplex)
	}
	fmt.Fprintf(&b, ", %d TX/%d RX queues", i.TxQueues, i.RxQueues)
	if c := i.Channels; c != nil {
		fmt.Fprintf(&b, ", channels %s", c)
	} else {
		b.WriteString(", channels ?")
	}
	if len(i.Offloads) == 0 {
		b.WriteString(", offloads ?")
	}
	for k, o := range i.Offloads {
		sep := ", "
		if k == 0 {
			sep = "; "
		}
		state := "off"
		if o.On {
			state = "on"
		}
		if o.Fixed {
			state += " (fixed)"
		}
		fmt.Fprintf(&b, "%s%s %s", sep, o.Label(), state)
	}
	return b.String()
}

// String is the channels in use and their maxima, the kinds the driver
// has: "combined 8/63", "rx 1/2 tx 1/2".
func (c Channels) String() string {
	var parts []string
	for _, k := range []struct {
		name     string
		cur, max uint32
	}{{"rx", c.RX, c.MaxRX}, {"tx", c.TX, c.MaxTX}, {"other", c.Other, c.MaxOther}, {"combined", c.Combined, c.MaxCombined}} {
		if k.max > 0 {
			parts = append(parts, fmt.Sprintf("%s %d/%d", k.name, k.cur, k.max))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// FormatSpeed is a link speed as ethtool's unit, Mb/s, or Gb/s from 1000
// Mb/s on: "10Gb/s", "2.5Gb/s", "100Mb/s".
func FormatSpeed(bps int64) string {
	mbps := float64(bps) / 1e6
	if mbps >= 1000 {
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", mbps/1000), "0"), ".") + "Gb/s"
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", mbps), "0"), ".") + "Mb/s"
}
