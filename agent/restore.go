package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// restorable returns the empty qdisc of q's kind that RestoreRoot can fill
// with q's legacy options (nil when q needs none of netlink's structs), or
// an error saying why sluice cannot give q back. A kernel default is
// always restorable (deleting sluice's root brings it back), and so is a
// root recorded as the kernel dumped it (q.Raw): its attributes go back
// unchanged, whatever its kind.
func restorable(q Qdisc) (netlink.Qdisc, error) {
	if q.Unrestorable != "" {
		return nil, fmt.Errorf("root qdisc %s %s: %s, which sluice cannot record to give back; remove them, or the root (tc qdisc del dev DEV root), before sluice takes the uplink", q.Kind, q.Handle, q.Unrestorable)
	}
	if q.Default || q.Raw {
		return nil, nil
	}
	// Records of an older sluice: netlink's struct of the kind as JSON.
	switch q.Kind {
	case "tbf":
		return &netlink.Tbf{}, nil
	case "fq_codel":
		return &netlink.FqCodel{}, nil
	case "fq":
		return &netlink.Fq{}, nil
	case "sfq":
		return &netlink.Sfq{}, nil
	case "prio":
		return &netlink.Prio{}, nil
	case "netem":
		return &netlink.Netem{}, nil
	case "mq", "pfifo_fast":
		// No options to keep: netlink reports them as generic.
		return &netlink.GenericQdisc{QdiscType: q.Kind}, nil
	}
	return nil, fmt.Errorf("root qdisc %s %s was recorded without its options; give it back by hand", q.Kind, q.Handle)
}

// CheckRestorable reports whether sluice could give q back after
// replacing it.
func CheckRestorable(q Qdisc) error { _, err := restorable(q); return err }

// rootDump is the root qdisc of one device as the kernel dumps it, and
// what else hangs below it.
type rootDump struct {
	tc       nl.TcMsg
	kind     string
	options  []byte // TCA_OPTIONS' payload, as dumped
	stab     bool   // a size table, which the kernel does not dump whole
	children int    // qdiscs below the root (not ingress/clsact)
}

// dumpRoot reads dev's qdiscs with a raw RTM_GETQDISC dump: netlink's
// structs drop parameters (tbf's mtu and minburst, for one), the raw
// attributes keep all of them.
func (k *NetlinkKernel) dumpRoot(ifindex int) (*rootDump, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETQDISC, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: k.raw}
	req.AddData(&nl.TcMsg{Family: unix.AF_UNSPEC, Ifindex: int32(ifindex)})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWQDISC)
	if err != nil {
		return nil, fmt.Errorf("RTM_GETQDISC: %w", err)
	}
	var root *rootDump
	children := 0
	for _, m := range msgs {
		if len(m) < nl.SizeofTcMsg {
			continue
		}
		tc := *nl.DeserializeTcMsg(m)
		if int(tc.Ifindex) != ifindex {
			continue
		}
		switch {
		case tc.Parent == netlink.HANDLE_ROOT:
			attrs, err := nl.ParseRouteAttr(m[nl.SizeofTcMsg:])
			if err != nil {
				return nil, fmt.Errorf("RTM_GETQDISC: %w", err)
			}
			root = &rootDump{tc: tc}
			for _, a := range attrs {
				switch a.Attr.Type {
				case nl.TCA_KIND:
					root.kind = string(bytes.TrimRight(a.Value, "\x00"))
				case nl.TCA_OPTIONS:
					root.options = append([]byte(nil), a.Value...)
				case nl.TCA_STAB:
					root.stab = true
				}
			}
		case tc.Parent == netlink.HANDLE_INGRESS || tc.Handle == netlink.HANDLE_INGRESS:
		default:
			children++
		}
	}
	if root != nil {
		root.children = children
	}
	return root, nil
}

// classesAndFilters counts the classes of the qdisc handle on ifindex
// (its root class, minor 0, aside) and the filters attached to it.
func (k *NetlinkKernel) classesAndFilters(ifindex int, handle uint32) (classes, filters int, err error) {
	dump := func(cmd, res int, parent uint32) ([]*nl.TcMsg, error) {
		req := nl.NewNetlinkRequest(cmd, unix.NLM_F_DUMP)
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: k.raw}
		req.AddData(&nl.TcMsg{Family: unix.AF_UNSPEC, Ifindex: int32(ifindex), Parent: parent})
		msgs, err := req.Execute(unix.NETLINK_ROUTE, uint16(res))
		if err != nil {
			return nil, err
		}
		var out []*nl.TcMsg
		for _, m := range msgs {
			if len(m) >= nl.SizeofTcMsg {
				if tc := nl.DeserializeTcMsg(m); int(tc.Ifindex) == ifindex {
					out = append(out, tc)
				}
			}
		}
		return out, nil
	}
	cs, err := dump(unix.RTM_GETTCLASS, unix.RTM_NEWTCLASS, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("RTM_GETTCLASS: %w", err)
	}
	for _, c := range cs {
		if c.Handle>>16 == handle>>16 && c.Handle&0xffff != 0 {
			classes++
		}
	}
	fs, err := dump(unix.RTM_GETTFILTER, unix.RTM_NEWTFILTER, handle)
	if err != nil {
		return 0, 0, fmt.Errorf("RTM_GETTFILTER: %w", err)
	}
	return classes, len(fs), nil
}

// rawKinds are the root kinds whose dump is all their configuration, so
// that sending it back gives the same qdisc: livetest/netlive's
// TestRootRoundTrip checks each one this kernel has, with and without
// optional parameters. red, gred, choke and sfb (their drop table), netem
// (its delay distribution) and the classful kinds with classes of the
// user's (their classes and filters) are refused.
var rawKinds = map[string]bool{"tbf": true, "htb": true, "pfifo": true, "bfifo": true, "pfifo_head_drop": true,
	"pfifo_fast": true, "fq": true, "fq_codel": true, "sfq": true, "prio": true, "codel": true, "noqueue": true}

// htbInitVersion rewrites the version in HTB's dumped TCA_HTB_INIT (struct
// tc_htb_glob): the kernel dumps HTB_VER (0x30011) but takes only its
// major (3) back.
func htbInitVersion(opts []byte) []byte {
	const tcaHTBInit = 2
	out := append([]byte(nil), opts...)
	for off := 0; off+4 <= len(out); {
		l := int(nl.NativeEndian().Uint16(out[off:]))
		typ := nl.NativeEndian().Uint16(out[off+2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || off+l > len(out) {
			break
		}
		if typ == tcaHTBInit && l >= 8 {
			if v := nl.NativeEndian().Uint32(out[off+4:]); v > 0xffff {
				nl.NativeEndian().PutUint32(out[off+4:], v>>16)
			}
		}
		off += (l + 3) &^ 3
	}
	return out
}

// classesMadeByKind are the kinds whose classes exist without being
// asked for (a band per priority): their classes are not the user's.
var classesMadeByKind = map[string]bool{"prio": true, "multiq": true, "mq": true, "mqprio": true, "ets": true, "taprio": true, "red": true, "tbf": true, "netem": true, "sfq": true, "fq_codel": true, "cake": true, "sfb": true, "choke": true}

// RootQdisc implements Kernel: the root as the kernel dumps it, every
// attribute kept (Raw), and why it could not be given back (other qdiscs,
// classes or filters below it, a size table).
func (k *NetlinkKernel) RootQdisc(dev string) (Qdisc, error) {
	l, err := k.link(dev)
	if err != nil {
		return Qdisc{}, err
	}
	idx := l.Attrs().Index
	id := fmt.Sprintf("netns%d-if%d-%s", k.nsIno, idx, dev)
	r, err := k.dumpRoot(idx)
	if err != nil {
		return Qdisc{}, err
	}
	if r == nil {
		// No root reported: the kernel's default (noqueue).
		return Qdisc{Kind: "noqueue", Handle: "0:0", Default: true, Device: id}, nil
	}
	out := Qdisc{Kind: r.kind, Handle: Handle(r.tc.Handle).String(), Default: r.tc.Handle>>16 == 0, Device: id}
	if out.Default || out.IsSluice() {
		return out, nil
	}
	out.Raw, out.TCAOptions = true, r.options
	if r.kind == "htb" {
		out.TCAOptions = htbInitVersion(out.TCAOptions)
	}
	classes, filters, err := k.classesAndFilters(idx, r.tc.Handle)
	if err != nil {
		return Qdisc{}, err
	}
	switch {
	case !rawKinds[r.kind]:
		out.Unrestorable = fmt.Sprintf("sluice gives back only roots of kinds %s (what it records of others, such as red's or netem's tables, the kernel does not report whole)", strings.Join(slices.Sorted(maps.Keys(rawKinds)), ", "))
	case r.stab:
		out.Unrestorable = "it has a size table (stab)"
	case r.children > 0:
		out.Unrestorable = fmt.Sprintf("qdiscs are attached below it (%d)", r.children)
	case filters > 0:
		out.Unrestorable = "filters are attached to it"
	case classes > 0 && !classesMadeByKind[r.kind]:
		out.Unrestorable = fmt.Sprintf("classes are defined in it (%d)", classes)
	}
	return out, nil
}

// RestoreRoot implements Kernel.
func (k *NetlinkKernel) RestoreRoot(dev string, q Qdisc) error {
	l, err := k.link(dev)
	if err != nil {
		return err
	}
	nq, err := restorable(q)
	if err != nil {
		return err
	}
	if q.Default {
		cur := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(rootQdiscMajor, 0), Parent: netlink.HANDLE_ROOT})
		if err := k.h.QdiscDel(cur); err != nil {
			return fmt.Errorf("QdiscDel root: %w", err)
		}
		return nil
	}
	h, err := ParseHandle(q.Handle)
	if err != nil {
		return fmt.Errorf("recorded handle of %s: %w", q.Kind, err)
	}
	if q.Raw {
		// The attributes as dumped go back unchanged.
		req := nl.NewNetlinkRequest(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: k.raw}
		req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(l.Attrs().Index), Handle: uint32(h), Parent: netlink.HANDLE_ROOT})
		req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(q.Kind)))
		if len(q.TCAOptions) > 0 {
			req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, q.TCAOptions))
		}
		if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
			return fmt.Errorf("RTM_NEWQDISC %s: %w", q.Kind, err)
		}
		return nil
	}
	if len(q.Options) > 0 {
		if err := json.Unmarshal(q.Options, nq); err != nil {
			return fmt.Errorf("recorded options of %s: %w", q.Kind, err)
		}
	}
	a := nq.Attrs()
	*a = netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: uint32(h), Parent: netlink.HANDLE_ROOT}
	if err := k.h.QdiscReplace(nq); err != nil {
		return fmt.Errorf("QdiscReplace %s: %w", q.Kind, err)
	}
	return nil
}

// DefaultRootsDir is where agents keep, device by device, the root qdisc
// they replaced (a copy of their state file's), so that `sluice agent
// uninstall` finds it whatever --state-dir the agent ran with. It lives as
// long as the kernel state it describes (until the next boot).
const DefaultRootsDir = "/run/sluice/roots"

// rootRecordPath is the file in dir of the root replaced on q.Device; ""
// when there is no dir or the device is not identified.
func rootRecordPath(dir string, q Qdisc) string {
	if dir == "" || q.Device == "" {
		return ""
	}
	return filepath.Join(dir, q.Device+".json")
}

// writeRootRecord keeps q, the root replaced on q.Device, in dir.
func writeRootRecord(dir string, q Qdisc) error {
	p := rootRecordPath(dir, q)
	if p == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("roots record: %w", err)
	}
	b, err := json.MarshalIndent(q, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return fmt.Errorf("roots record: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("roots record: %w", err)
	}
	return nil
}

// readRootRecord returns the root recorded in dir for the device of cur
// (sluice's root there now); ok is false when none is.
func readRootRecord(dir string, cur Qdisc) (q Qdisc, ok bool, err error) {
	p := rootRecordPath(dir, cur)
	if p == "" {
		return Qdisc{}, false, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return Qdisc{}, false, nil
	}
	if err != nil {
		return Qdisc{}, false, err
	}
	if err := json.Unmarshal(b, &q); err != nil {
		return Qdisc{}, false, fmt.Errorf("%s: %w", p, err)
	}
	return q, true, nil
}

// removeRootRecord forgets the root of cur's device once given back.
func removeRootRecord(dir string, cur Qdisc) error {
	p := rootRecordPath(dir, cur)
	if p == "" {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// nsInode is the inode of the network namespace of fd (or of this
// thread's when fd < 0): with an ifindex it names a device on this host.
func nsInode(fd int) uint64 {
	var st syscall.Stat_t
	var err error
	if fd >= 0 {
		err = syscall.Fstat(fd, &st)
	} else {
		err = syscall.Stat("/proc/thread-self/ns/net", &st)
	}
	if err != nil {
		return 0
	}
	return st.Ino
}

// MasterKind implements Kernel.
func (k *NetlinkKernel) MasterKind(dev string) (string, error) {
	l, err := k.link(dev)
	if err != nil {
		return "", err
	}
	mi := l.Attrs().MasterIndex
	if mi == 0 {
		return "", nil
	}
	m, err := k.h.LinkByIndex(mi)
	if err != nil {
		return "", fmt.Errorf("LinkByIndex %d: %w", mi, err)
	}
	return m.Type(), nil
}

// ForgetNetnsRoots removes from the roots directory dir the records of
// every device of the network namespace with inode nsIno: the namespace
// is being deleted (lab down), and its devices, and what sluice replaced
// on them, with it.
func ForgetNetnsRoots(dir string, nsIno uint64) error {
	m, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("netns%d-if*.json", nsIno)))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range m {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NetnsInode is the inode of the network namespace file path (a
// /run/netns entry), 0 when it cannot be read.
func NetnsInode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}
