package nicinfo

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// requestTimeout bounds each request to the kernel.
var requestTimeout = unix.Timeval{Sec: 5}

// Reader reads devices' NICs in one network namespace, through sockets
// opened there: rtnetlink (the queue counts), generic netlink (ethtool
// netlink) and the ETHTOOL_GDRVINFO ioctl, sent on the generic netlink
// socket (the kernel hands a socket's unknown SIOC* ioctls to its
// network namespace's devices, whatever the socket's family).
type Reader struct {
	h    *netlink.Handle
	genl *nl.SocketHandle
	// family is ethtool netlink's family id; 0 when the kernel has none
	// (built without CONFIG_ETHTOOL_NETLINK), for the reason noFamily.
	family   uint16
	noFamily error
	// record, when set (tests), gets each ethtool netlink reply as
	// received: the message after its netlink header.
	record func(cmd uint8, dev string, reply []byte)
}

// Open opens a Reader in the named network namespace ("": the current
// one). A kernel without ethtool netlink is not an error: every Read then
// gives speed, channels and offloads as unknown.
func Open(nsName string) (*Reader, error) {
	ns := netns.None()
	if nsName != "" {
		var err error
		if ns, err = netns.GetFromName(nsName); err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", nsName, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("netlink in %q: %w", nsName, err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("generic netlink in %q: %w", nsName, err)
	}
	_ = s.SetSendTimeout(&requestTimeout)
	_ = s.SetReceiveTimeout(&requestTimeout)
	_ = s.SetExtAck(true) // the kernel's reason in errors, where it gives one
	r := &Reader{h: h, genl: &nl.SocketHandle{Socket: s}}
	if fam, err := h.GenlFamilyGet(genlName); err != nil {
		r.noFamily = fmt.Errorf("no ethtool netlink in this kernel (generic netlink family %q: %v)", genlName, err)
	} else {
		r.family = fam.ID
	}
	return r, nil
}

// Close releases the Reader's sockets.
func (r *Reader) Close() {
	r.h.Close()
	r.genl.Close()
}

// Read reads dev's NIC. What the device does not support is unknown in
// the Info (Info.Unknown says what and why); an error is a failure to ask
// (no such device, a malformed reply), and the Info then holds what was
// read.
func (r *Reader) Read(dev string) (Info, error) {
	info := Info{Dev: dev}
	l, err := r.h.LinkByName(dev)
	if err != nil {
		return info, fmt.Errorf("LinkByName %s: %w", dev, err)
	}
	info.TxQueues, info.RxQueues = l.Attrs().NumTxQueues, l.Attrs().NumRxQueues
	var errs []error
	known := func(what, op string, err error) bool {
		switch {
		case err == nil:
			return true
		case errors.Is(err, unix.EOPNOTSUPP):
			info.Unknown = append(info.Unknown, what+" (not supported by the device)")
		default:
			errs = append(errs, fmt.Errorf("%s %s: %w", op, dev, err))
		}
		return false
	}
	d, err := unix.IoctlGetEthtoolDrvinfo(r.genl.Socket.GetFd(), dev)
	if known("driver", "ETHTOOL_GDRVINFO", err) {
		info.Driver, info.DriverVersion = unix.ByteSliceToString(d.Driver[:]), unix.ByteSliceToString(d.Version[:])
		info.FirmwareVersion, info.BusInfo = unix.ByteSliceToString(d.Fw_version[:]), unix.ByteSliceToString(d.Bus_info[:])
	}
	if r.family == 0 {
		for _, what := range []string{"speed", "channels", "offloads"} {
			info.Unknown = append(info.Unknown, fmt.Sprintf("%s (%v)", what, r.noFamily))
		}
		return info, errors.Join(errs...)
	}
	msg, err := r.get(msgLinkModesGet, dev)
	if known("speed", "LINKMODES_GET", err) {
		lm, err := parseLinkModes(msg)
		if known("speed", "LINKMODES_GET reply", err) {
			info.SpeedBps, info.Duplex = lm.speedBps, lm.duplex
			if lm.speedBps == 0 {
				// virtio_net without a speed set, for one: ethtool's
				// "Speed: Unknown!".
				info.Unknown = append(info.Unknown, "speed (the driver reports none)")
			}
		}
	}
	msg, err = r.get(msgChannelsGet, dev)
	if known("channels", "CHANNELS_GET", err) {
		c, err := parseChannels(msg)
		if known("channels", "CHANNELS_GET reply", err) {
			info.Channels = &c
		}
	}
	msg, err = r.get(msgFeaturesGet, dev)
	if known("offloads", "FEATURES_GET", err) {
		f, err := parseFeatures(msg)
		if known("offloads", "FEATURES_GET reply", err) {
			info.Offloads = f.offloads()
		}
	}
	return info, errors.Join(errs...)
}

// get sends one ethtool netlink GET request for dev, with verbose bitsets
// (no ETHTOOL_FLAG_COMPACT_BITSETS: bits come with their names), and
// returns its reply.
func (r *Reader) get(cmd uint8, dev string) ([]byte, error) {
	req := nl.NewNetlinkRequest(int(r.family), 0)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: r.genl}
	hdr := nl.NewRtAttr(attrHeader|int(nl.NLA_F_NESTED), nil)
	hdr.AddRtAttr(headerDevName, nl.ZeroTerminated(dev))
	req.AddRawData([]byte{cmd, genlVersion, 0, 0}) // struct genlmsghdr
	req.AddRawData(hdr.Serialize())
	msgs, err := req.Execute(unix.NETLINK_GENERIC, r.family)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("%d replies, want 1", len(msgs))
	}
	if r.record != nil {
		r.record(cmd, dev, msgs[0])
	}
	return msgs[0], nil
}
