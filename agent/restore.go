package agent

import (
	"encoding/json"
	"fmt"

	"github.com/vishvananda/netlink"
)

// restorable returns the empty qdisc of q's kind that RestoreRoot can fill
// with q's options, or an error saying why sluice cannot give q back. A
// kernel default is always restorable (deleting sluice's root brings it
// back); an explicit root only when netlink knows its options.
func restorable(q Qdisc) (netlink.Qdisc, error) {
	if q.Default {
		return nil, nil
	}
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
	return nil, fmt.Errorf("root qdisc %s %s was set by hand and sluice cannot record its options to give it back; remove it (tc qdisc del dev DEV root) or make it one of tbf, fq_codel, fq, sfq, prio, netem, mq", q.Kind, q.Handle)
}

// CheckRestorable reports whether sluice could give q back after
// replacing it.
func CheckRestorable(q Qdisc) error { _, err := restorable(q); return err }

// RootQdisc implements Kernel.
func (k *NetlinkKernel) RootQdisc(dev string) (Qdisc, error) {
	l, err := k.link(dev)
	if err != nil {
		return Qdisc{}, err
	}
	qs, err := k.h.QdiscList(l)
	if err != nil {
		return Qdisc{}, fmt.Errorf("QdiscList: %w", err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if a.Parent != netlink.HANDLE_ROOT {
			continue
		}
		a.Statistics = nil // counters are not part of what is given back
		out := Qdisc{Kind: q.Type(), Handle: Handle(a.Handle).String(), Default: a.Handle>>16 == 0}
		if _, generic := q.(*netlink.GenericQdisc); !generic {
			if out.Options, err = json.Marshal(q); err != nil {
				return Qdisc{}, err
			}
		}
		return out, nil
	}
	// No root reported: the kernel's default (noqueue).
	return Qdisc{Kind: "noqueue", Handle: "0:0", Default: true}, nil
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
	if nq == nil {
		cur := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(rootQdiscMajor, 0), Parent: netlink.HANDLE_ROOT})
		if err := k.h.QdiscDel(cur); err != nil {
			return fmt.Errorf("QdiscDel root: %w", err)
		}
		return nil
	}
	if len(q.Options) > 0 {
		if err := json.Unmarshal(q.Options, nq); err != nil {
			return fmt.Errorf("recorded options of %s: %w", q.Kind, err)
		}
	}
	a := nq.Attrs()
	h, err := ParseHandle(q.Handle)
	if err != nil {
		return fmt.Errorf("recorded handle of %s: %w", q.Kind, err)
	}
	*a = netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: uint32(h), Parent: netlink.HANDLE_ROOT}
	if err := k.h.QdiscReplace(nq); err != nil {
		return fmt.Errorf("QdiscReplace %s: %w", q.Kind, err)
	}
	return nil
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
