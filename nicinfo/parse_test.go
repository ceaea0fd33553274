package nicinfo

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

// reply builds an ethtool netlink reply: the generic netlink header of
// cmd, then the attributes.
func replyOf(cmd uint8, attrs ...*nl.RtAttr) []byte {
	b := []byte{cmd, genlVersion, 0, 0}
	for _, a := range attrs {
		b = append(b, a.Serialize()...)
	}
	return b
}

func u32Attr(typ int, v uint32) *nl.RtAttr { return nl.NewRtAttr(typ, nl.Uint32Attr(v)) }

// header is a reply's request header naming dev, as the kernel sends it.
func header(dev string) *nl.RtAttr {
	h := nl.NewRtAttr(attrHeader|int(nl.NLA_F_NESTED), nil)
	h.AddRtAttr(1, nl.Uint32Attr(7)) // ETHTOOL_A_HEADER_DEV_INDEX
	h.AddRtAttr(headerDevName, nl.ZeroTerminated(dev))
	return h
}

// bit is one bit of a verbose bitset: its index, name and, with a mask,
// whether it is set.
type bit struct {
	index uint32
	name  string
	value bool
}

// bitset is a verbose bitset attribute of type typ; noMask lists only
// set bits (the kernel's form for features).
func bitset(typ int, noMask bool, bits ...bit) *nl.RtAttr {
	s := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
	if noMask {
		s.AddRtAttr(bitsetNoMask, nil)
	}
	s.AddRtAttr(2, nl.Uint32Attr(64)) // ETHTOOL_A_BITSET_SIZE
	list := s.AddRtAttr(bitsetBits|int(nl.NLA_F_NESTED), nil)
	for _, b := range bits {
		e := list.AddRtAttr(bitsBit|int(nl.NLA_F_NESTED), nil)
		e.AddRtAttr(1, nl.Uint32Attr(b.index)) // ETHTOOL_A_BITSET_BIT_INDEX
		e.AddRtAttr(bitName, nl.ZeroTerminated(b.name))
		if b.value {
			e.AddRtAttr(bitValue, nil)
		}
	}
	return s
}

// recorded reads a reply TestReadLive -record wrote into testdata.
func recorded(t *testing.T, name string) []byte {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", name+".hex"))
	if err != nil {
		t.Fatal(err)
	}
	var h strings.Builder
	for _, l := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(l, "#") {
			h.WriteString(strings.TrimSpace(l))
		}
	}
	b, err := hex.DecodeString(h.String())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

func TestParseLinkModes(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  []byte
		want linkModes
		err  string
	}{
		{name: "25G full", msg: replyOf(replyLinkModes, header("eth0"), nl.NewRtAttr(linkModesAutoneg, []byte{1}),
			u32Attr(linkModesSpeed, 25000), nl.NewRtAttr(linkModesDuplex, []byte{duplexFull})),
			want: linkModes{speedBps: 25e9, duplex: "full"}},
		{name: "100M half", msg: replyOf(replyLinkModes, header("eth0"), u32Attr(linkModesSpeed, 100), nl.NewRtAttr(linkModesDuplex, []byte{duplexHalf})),
			want: linkModes{speedBps: 100e6, duplex: "half"}},
		{name: "no link: speed and duplex unknown", msg: replyOf(replyLinkModes, header("eth0"), u32Attr(linkModesSpeed, speedUnknown),
			nl.NewRtAttr(linkModesDuplex, []byte{duplexUnknown}))},
		{name: "neither attribute", msg: replyOf(replyLinkModes, header("eth0"))},
		{name: "bad duplex", msg: replyOf(replyLinkModes, u32Attr(linkModesSpeed, 1000), nl.NewRtAttr(linkModesDuplex, []byte{7})),
			err: "duplex 7: neither half (0), full (1) nor unknown (255)"},
		{name: "speed of two bytes", msg: replyOf(replyLinkModes, nl.NewRtAttr(linkModesSpeed, []byte{1, 2})),
			err: "speed: attribute 5: 2 bytes, want a u32"},
		{name: "another message's reply", msg: replyOf(replyChannels, header("eth0")), err: "reply command 18, want 4"},
		{name: "no genl header", msg: []byte{4, 1}, err: "reply of 2 bytes: no generic netlink header"},
		{name: "truncated attribute", msg: append([]byte{replyLinkModes, 1, 0, 0}, 0x20, 0, 5, 0, 1, 2, 3, 4),
			err: "malformed attributes"},
		{name: "recorded: veth", msg: recorded(t, "veth-linkmodes"), want: linkModes{speedBps: 10e9, duplex: "full"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseLinkModes(c.msg)
			checkErr(t, err, c.err)
			if err == nil && got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// linkModesAutoneg is ETHTOOL_A_LINKMODES_AUTONEG (u8), which the parser
// skips.
const linkModesAutoneg = 2

func TestParseChannels(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  []byte
		want Channels
		err  string
	}{
		{name: "multi-queue NIC: combined 8 of 63", msg: replyOf(replyChannels, header("eth0"),
			u32Attr(channelsCombinedMax, 63), u32Attr(channelsCombinedCount, 8), u32Attr(channelsOtherMax, 1), u32Attr(channelsOtherCount, 1)),
			want: Channels{Combined: 8, MaxCombined: 63, Other: 1, MaxOther: 1}},
		{name: "separate rx and tx", msg: replyOf(replyChannels, header("eth0"),
			u32Attr(channelsRXMax, 16), u32Attr(channelsTXMax, 16), u32Attr(channelsRXCount, 4), u32Attr(channelsTXCount, 2)),
			want: Channels{RX: 4, TX: 2, MaxRX: 16, MaxTX: 16}},
		{name: "no kind of channel", msg: replyOf(replyChannels, header("eth0"))},
		{name: "count of a byte", msg: replyOf(replyChannels, nl.NewRtAttr(channelsTXCount, []byte{1})),
			err: "channels: attribute 7: 1 bytes, want a u32"},
		{name: "recorded: veth, rx 1/2 tx 1/2", msg: recorded(t, "veth-channels"), want: Channels{RX: 1, TX: 1, MaxRX: 2, MaxTX: 2}},
		{name: "recorded: tap, combined 0/1", msg: recorded(t, "tap-channels"), want: Channels{MaxCombined: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseChannels(c.msg)
			checkErr(t, err, c.err)
			if err == nil && got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseFeatures(t *testing.T) {
	tso4, tso6 := bit{16, "tx-tcp-segmentation", false}, bit{19, "tx-tcp6-segmentation", false}
	gso, gro, lro := bit{11, "tx-generic-segmentation", false}, bit{14, "rx-gro", false}, bit{15, "rx-lro", false}
	rxcsum, csum := bit{32, "rx-checksum", false}, bit{3, "tx-checksum-ip-generic", false}
	unused := bit{2, "", false} // a slot without a name, as the kernel lists it
	on := func(b bit) bit { b.value = true; return b }
	all := []bit{tso4, tso6, gso, gro, lro, rxcsum, csum}
	off := func(name string, fixed, requested bool) Offload {
		return Offload{Name: name, Fixed: fixed, Requested: requested}
	}
	onOf := func(name string, fixed bool) Offload { return Offload{Name: name, On: true, Fixed: fixed} }
	for _, c := range []struct {
		name string
		msg  []byte
		want []Offload
		err  string
	}{
		{name: "a NIC with every offload on, LRO off",
			msg: replyOf(replyFeatures, header("eth0"),
				bitset(featuresHW, true, tso4, tso6, gso, gro, lro, rxcsum, csum),
				bitset(featuresWanted, true, tso4, tso6, gso, gro, rxcsum, csum),
				bitset(featuresActive, true, unused, tso4, tso6, gso, gro, rxcsum, csum),
				bitset(featuresNoChange, true)),
			want: []Offload{onOf("tso", false), onOf("gso", false), onOf("gro", false), off("lro", false, false), onOf("rx", false), onOf("tx", false)}},
		{name: "TSO on when only its IPv6 feature is (ethtool's rule: any)",
			msg:  replyOf(replyFeatures, bitset(featuresHW, true, tso4, tso6), bitset(featuresActive, true, tso6)),
			want: []Offload{onOf("tso", false), off("gso", true, false), off("gro", true, false), off("lro", true, false), off("rx", true, false), off("tx", true, false)}},
		{name: "fixed: not in hw, or in nochange; requested: wanted but kept off (a tap's TSO)",
			msg: replyOf(replyFeatures, bitset(featuresHW, true, tso4, gso), bitset(featuresWanted, true, tso4, gso),
				bitset(featuresActive, true, gro), bitset(featuresNoChange, true, gso)),
			want: []Offload{off("tso", false, true), off("gso", true, true), onOf("gro", true), off("lro", true, false), off("rx", true, false), off("tx", true, false)}},
		{name: "bitsets with a mask: VALUE marks the set bits",
			msg: replyOf(replyFeatures, bitset(featuresHW, false, on(gro), on(gso)),
				bitset(featuresActive, false, gso, on(gro), tso4, on(csum))),
			want: []Offload{off("tso", true, false), off("gso", false, false), onOf("gro", false), off("lro", true, false), off("rx", true, false), onOf("tx", true)}},
		{name: "no active bitset", msg: replyOf(replyFeatures, header("eth0"), bitset(featuresHW, true, all...)),
			err: "features: no active bitset in the reply"},
		{name: "a compact bitset", msg: replyOf(replyFeatures, compact(featuresActive)),
			err: "features active: a compact bitset, without the bits' names"},
		{name: "recorded: veth after ethtool -K gso off", msg: recorded(t, "veth-gso-off"),
			want: []Offload{onOf("tso", false), off("gso", false, false), off("gro", false, false), off("lro", true, false), onOf("rx", false), onOf("tx", false)}},
		{name: "recorded: tap without a reader", msg: recorded(t, "tap-features"),
			want: []Offload{off("tso", false, true), onOf("gso", false), onOf("gro", false), off("lro", true, false), off("rx", true, false), off("tx", false, true)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := parseFeatures(c.msg)
			checkErr(t, err, c.err)
			if err != nil {
				return
			}
			if got := f.offloads(); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// compact is a compact bitset (VALUE and MASK words, no names).
func compact(typ int) *nl.RtAttr {
	s := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
	s.AddRtAttr(2, nl.Uint32Attr(32))
	s.AddRtAttr(bitsetValue, nl.Uint32Attr(0x4800))
	s.AddRtAttr(5, nl.Uint32Attr(0xffff)) // ETHTOOL_A_BITSET_MASK
	return s
}

func TestWarnings(t *testing.T) {
	offloads := func(tso, gso, gro Offload) []Offload {
		tso.Name, gso.Name, gro.Name = "tso", "gso", "gro"
		return []Offload{tso, gso, gro, {Name: "lro"}, {Name: "rx", On: true}, {Name: "tx", On: true}}
	}
	on := Offload{On: true}
	for _, c := range []struct {
		name string
		info Info
		want []string
	}{
		{"all on (LRO off does not warn)", Info{Dev: "eth0", Offloads: offloads(on, on, on)}, nil},
		{"offloads unknown", Info{Dev: "eth0"}, nil},
		{"GSO off, can be turned on", Info{Dev: "sl-up0", Offloads: offloads(on, Offload{}, on)}, []string{
			"GSO is off on sl-up0: every packet goes down the stack MTU-sized, so CPU per Gbps sent rises (seed 001); `ethtool -K sl-up0 gso on` turns it on"}},
		{"TSO fixed off, GRO requested", Info{Dev: "eth1", Offloads: offloads(Offload{Fixed: true}, on, Offload{Requested: true})}, []string{
			"TSO is off on eth1: the kernel cuts every TCP segment to MTU size in software, so CPU per Gbps sent rises (seed 001: almost doubled); the driver cannot turn it on",
			"GRO is off on eth1: received segments are not merged, every MTU-sized packet climbs the stack alone, so CPU per Gbps received rises (seed 001); it is requested on, but the device keeps it off"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.info.Warnings(); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	for _, c := range []struct {
		info Info
		want string
	}{
		{Info{Dev: "eth0", Driver: "ixgbe", DriverVersion: "6.1.0", SpeedBps: 10e9, Duplex: "full", TxQueues: 8, RxQueues: 8,
			Channels: &Channels{Combined: 8, MaxCombined: 63}, Offloads: []Offload{{Name: "tso", On: true}, {Name: "lro", Fixed: true}}},
			"driver ixgbe 6.1.0, 10Gb/s full duplex, 8 TX/8 RX queues, channels combined 8/63; TSO on, LRO off (fixed)"},
		{Info{Dev: "lo", TxQueues: 1, RxQueues: 1}, "driver ?, speed ?, 1 TX/1 RX queues, channels ?, offloads ?"},
		{Info{Dev: "eth2", Driver: "mlx5_core", SpeedBps: 2500e6, TxQueues: 4, RxQueues: 4, Channels: &Channels{}},
			"driver mlx5_core, 2.5Gb/s, 4 TX/4 RX queues, channels none, offloads ?"},
	} {
		if got := c.info.Summary(); got != c.want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.info.Dev, got, c.want)
		}
	}
	for bps, want := range map[int64]string{100e6: "100Mb/s", 1e9: "1Gb/s", 25e9: "25Gb/s", 2500e6: "2.5Gb/s", 10e6: "10Mb/s"} {
		if got := FormatSpeed(bps); got != want {
			t.Errorf("FormatSpeed(%d) = %s, want %s", bps, got, want)
		}
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q, want %q", err, want)
	}
}
