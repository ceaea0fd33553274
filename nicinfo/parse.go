package nicinfo

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
)

// ethtool netlink, from the kernel's uapi linux/ethtool_netlink.h: the
// family, the messages Info needs and their attributes. Every message's
// first attribute is its request header (ETHTOOL_A_*_HEADER = 1).
const (
	genlName    = "ethtool" // ETHTOOL_GENL_NAME
	genlVersion = 1         // ETHTOOL_GENL_VERSION

	msgLinkModesGet = 4  // ETHTOOL_MSG_LINKMODES_GET
	msgFeaturesGet  = 11 // ETHTOOL_MSG_FEATURES_GET
	msgChannelsGet  = 17 // ETHTOOL_MSG_CHANNELS_GET

	replyLinkModes = 4  // ETHTOOL_MSG_LINKMODES_GET_REPLY
	replyFeatures  = 11 // ETHTOOL_MSG_FEATURES_GET_REPLY
	replyChannels  = 18 // ETHTOOL_MSG_CHANNELS_GET_REPLY

	attrHeader    = 1 // ETHTOOL_A_*_HEADER (nested ETHTOOL_A_HEADER_*)
	headerDevName = 2 // ETHTOOL_A_HEADER_DEV_NAME, string

	linkModesSpeed  = 5 // ETHTOOL_A_LINKMODES_SPEED, u32 Mb/s
	linkModesDuplex = 6 // ETHTOOL_A_LINKMODES_DUPLEX, u8

	channelsRXMax         = 2 // ETHTOOL_A_CHANNELS_RX_MAX … _COMBINED_COUNT, u32
	channelsTXMax         = 3
	channelsOtherMax      = 4
	channelsCombinedMax   = 5
	channelsRXCount       = 6
	channelsTXCount       = 7
	channelsOtherCount    = 8
	channelsCombinedCount = 9

	featuresHW       = 2 // ETHTOOL_A_FEATURES_HW: what the device can change
	featuresWanted   = 3 // ETHTOOL_A_FEATURES_WANTED: what was asked for
	featuresActive   = 4 // ETHTOOL_A_FEATURES_ACTIVE: what is on
	featuresNoChange = 5 // ETHTOOL_A_FEATURES_NOCHANGE: what never changes

	bitsetNoMask = 1 // ETHTOOL_A_BITSET_NOMASK, flag: the bits listed are the set ones
	bitsetBits   = 3 // ETHTOOL_A_BITSET_BITS, nested ETHTOOL_A_BITSET_BITS_BIT
	bitsetValue  = 4 // ETHTOOL_A_BITSET_VALUE, binary: a compact bitset

	bitsBit = 1 // ETHTOOL_A_BITSET_BITS_BIT, nested ETHTOOL_A_BITSET_BIT_*

	bitName  = 2 // ETHTOOL_A_BITSET_BIT_NAME, string
	bitValue = 3 // ETHTOOL_A_BITSET_BIT_VALUE, flag: the bit is set

	speedUnknown  = 0xffffffff // SPEED_UNKNOWN (-1)
	duplexHalf    = 0          // DUPLEX_HALF
	duplexFull    = 1          // DUPLEX_FULL
	duplexUnknown = 0xff       // DUPLEX_UNKNOWN
)

// attr is one netlink attribute: its type without the nested and
// byte-order flags, and its payload.
type attr struct {
	typ   uint16
	value []byte
}

// parseAttrs splits b into its attributes, in order.
func parseAttrs(b []byte) ([]attr, error) {
	raw, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil, fmt.Errorf("malformed attributes: %w", err)
	}
	out := make([]attr, len(raw))
	for i, a := range raw {
		out[i] = attr{typ: a.Attr.Type & nl.NLA_TYPE_MASK, value: a.Value}
	}
	return out, nil
}

func (a attr) u32() (uint32, error) {
	if len(a.value) != 4 {
		return 0, fmt.Errorf("attribute %d: %d bytes, want a u32", a.typ, len(a.value))
	}
	return nl.NativeEndian().Uint32(a.value), nil
}

func (a attr) u8() (uint8, error) {
	if len(a.value) != 1 {
		return 0, fmt.Errorf("attribute %d: %d bytes, want a u8", a.typ, len(a.value))
	}
	return a.value[0], nil
}

// str is a NUL-terminated string attribute.
func (a attr) str() string {
	b := a.value
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// reply checks the generic netlink header of a reply (the message after
// its netlink header) and returns its attributes.
func reply(msg []byte, cmd uint8) ([]attr, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, fmt.Errorf("reply of %d bytes: no generic netlink header", len(msg))
	}
	if msg[0] != cmd {
		return nil, fmt.Errorf("reply command %d, want %d", msg[0], cmd)
	}
	return parseAttrs(msg[nl.SizeofGenlmsg:])
}

// linkModes are the speed and duplex of a LINKMODES_GET reply: bits/s (0:
// unknown) and "full", "half" or "" (unknown).
type linkModes struct {
	speedBps int64
	duplex   string
}

func parseLinkModes(msg []byte) (linkModes, error) {
	var lm linkModes
	as, err := reply(msg, replyLinkModes)
	if err != nil {
		return lm, err
	}
	for _, a := range as {
		switch a.typ {
		case linkModesSpeed:
			v, err := a.u32()
			if err != nil {
				return lm, fmt.Errorf("speed: %w", err)
			}
			if v != speedUnknown {
				lm.speedBps = int64(v) * 1e6
			}
		case linkModesDuplex:
			v, err := a.u8()
			if err != nil {
				return lm, fmt.Errorf("duplex: %w", err)
			}
			switch v {
			case duplexHalf:
				lm.duplex = "half"
			case duplexFull:
				lm.duplex = "full"
			case duplexUnknown:
			default:
				return lm, fmt.Errorf("duplex %d: neither half (0), full (1) nor unknown (255)", v)
			}
		}
	}
	return lm, nil
}

// parseChannels reads a CHANNELS_GET reply. The kernel sends a kind's
// count and maximum only when its maximum is not 0: an absent kind is 0.
func parseChannels(msg []byte) (Channels, error) {
	var c Channels
	as, err := reply(msg, replyChannels)
	if err != nil {
		return c, err
	}
	field := map[uint16]*uint32{
		channelsRXMax: &c.MaxRX, channelsTXMax: &c.MaxTX, channelsOtherMax: &c.MaxOther, channelsCombinedMax: &c.MaxCombined,
		channelsRXCount: &c.RX, channelsTXCount: &c.TX, channelsOtherCount: &c.Other, channelsCombinedCount: &c.Combined,
	}
	for _, a := range as {
		p, ok := field[a.typ]
		if !ok {
			continue
		}
		if *p, err = a.u32(); err != nil {
			return c, fmt.Errorf("channels: %w", err)
		}
	}
	return c, nil
}

// featureSet is a FEATURES_GET reply: each bitset as the features (by
// the kernel's name, netdev_features_strings) that are set in it.
type featureSet struct {
	hw, wanted, active, nochange map[string]bool
}

func parseFeatures(msg []byte) (featureSet, error) {
	var f featureSet
	as, err := reply(msg, replyFeatures)
	if err != nil {
		return f, err
	}
	set := map[uint16]*map[string]bool{featuresHW: &f.hw, featuresWanted: &f.wanted, featuresActive: &f.active, featuresNoChange: &f.nochange}
	names := map[uint16]string{featuresHW: "hw", featuresWanted: "wanted", featuresActive: "active", featuresNoChange: "nochange"}
	for _, a := range as {
		p, ok := set[a.typ]
		if !ok {
			continue
		}
		if *p, err = parseBitset(a.value); err != nil {
			return f, fmt.Errorf("features %s: %w", names[a.typ], err)
		}
	}
	if f.active == nil {
		return f, errors.New("features: no active bitset in the reply")
	}
	return f, nil
}

// parseBitset reads a verbose bitset: the names of its bits that are
// set. Without a mask (NOMASK) the kernel lists only the set bits; with
// one it lists the bits of the mask and flags the set ones (VALUE). A
// compact bitset carries no names and is refused: Reader never asks for
// one.
func parseBitset(b []byte) (map[string]bool, error) {
	as, err := parseAttrs(b)
	if err != nil {
		return nil, err
	}
	noMask, compact := false, false
	var bits []byte
	for _, a := range as {
		switch a.typ {
		case bitsetNoMask:
			noMask = true
		case bitsetBits:
			bits = a.value
		case bitsetValue:
			compact = true
		}
	}
	if bits == nil && compact {
		return nil, errors.New("a compact bitset, without the bits' names")
	}
	list, err := parseAttrs(bits)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, bit := range list {
		if bit.typ != bitsBit {
			continue
		}
		fields, err := parseAttrs(bit.value)
		if err != nil {
			return nil, err
		}
		name, value := "", false
		for _, f := range fields {
			switch f.typ {
			case bitName:
				name = f.str()
			case bitValue:
				value = true
			}
		}
		// A bit without a name is a slot the kernel no longer uses
		// (features bit 2, once NETIF_F_NO_CSUM): nothing to report.
		if name != "" && (noMask || value) {
			out[name] = true
		}
	}
	return out, nil
}

// offloads groups the features as ethtool's legacy offload lines do: an
// offload is on when any of its features is active, and fixed when none
// can change (absent from hw, or in nochange); requested when it is off
// but some of its features are wanted. The kernel lists only the
// features set in each bitset, so an offload none of whose features is
// listed anywhere is off and fixed, as `ethtool -k` shows it.
func (f featureSet) offloads() []Offload {
	all := map[string]bool{}
	for _, s := range []map[string]bool{f.hw, f.wanted, f.active, f.nochange} {
		for n := range s {
			all[n] = true
		}
	}
	out := make([]Offload, 0, len(offloadGroups))
	for _, g := range offloadGroups {
		o := Offload{Name: g.name, Fixed: true}
		for n := range all {
			if !g.match(n) {
				continue
			}
			o.On = o.On || f.active[n]
			o.Requested = o.Requested || f.wanted[n]
			if f.hw[n] && !f.nochange[n] {
				o.Fixed = false
			}
		}
		o.Requested = o.Requested && !o.On
		out = append(out, o)
	}
	return out
}
