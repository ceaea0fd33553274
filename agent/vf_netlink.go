package agent

import "fmt"

// The netlink side of SR-IOV VFs: NetlinkKernel is the VFKernel of a
// host. Rates are whole Mbit/s both ways (IFLA_VF_RATE's unit), so no
// conversion happens here.

var _ VFKernel = (*NetlinkKernel)(nil)

// VFRates reads the rates of pf's VFs: RTM_GETLINK with
// RTEXT_FILTER_VF (LinkByName asks for it), IFLA_VFINFO_LIST.
func (k *NetlinkKernel) VFRates(pf string) (map[int]VFRate, error) {
	l, err := k.link(pf)
	if err != nil {
		return nil, err
	}
	out := map[int]VFRate{}
	for _, v := range l.Attrs().Vfs {
		out[v.ID] = VFRate{MinTxMbps: v.MinTxRate, MaxTxMbps: v.MaxTxRate}
	}
	return out, nil
}

// SetVFRate sets VF vf of pf to r: RTM_SETLINK on the PF with
// IFLA_VFINFO_LIST / IFLA_VF_INFO / IFLA_VF_RATE.
func (k *NetlinkKernel) SetVFRate(pf string, vf int, r VFRate) error {
	l, err := k.link(pf)
	if err != nil {
		return err
	}
	if err := k.h.LinkSetVfRate(l, vf, int(r.MinTxMbps), int(r.MaxTxMbps)); err != nil {
		return fmt.Errorf("LinkSetVfRate %s vf %d (%s): %w", pf, vf, r, err)
	}
	return nil
}
