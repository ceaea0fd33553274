package lab

import (
	"context"
	"fmt"
	"os/exec"

	"sluice/policy"
)

// A namespace VM migrates by re-plugging: each vNIC's host-side veth
// (NICPlan.HostDev) moves from the source host's namespace to the
// destination's and becomes a port of the destination's bridge of the
// same uplink. The VM's namespace, its addresses and its MAC do not
// change, so its flows go on (the fabric bridge learns the MAC on the
// destination's uplink from the VM's next frame). The kernel drops the
// device's qdiscs and filters on the way; the destination's agent adds its
// own. Nothing new is created: the veth still dies with the VM's
// namespace, so the state file stays right and `sluice lab down` cleans
// up as before. A QEMU guest is not re-plugged (MoveLines refuses it):
// Move migrates it live with libvirt (MigrateGuest, lab/migrate.go).
// Disks are not reconnected to the destination's gateway yet.

// MoveLines returns the `ip -batch` lines (batch's "-n NS" form) that move
// vm's vNICs from host from to host to.
func (pl *Plan) MoveLines(vm, from, to string) ([]string, error) {
	v := pl.VM(vm)
	if v == nil {
		return nil, fmt.Errorf("lab: no VM %q", vm)
	}
	if v.Kind == policy.LabQemu {
		return nil, fmt.Errorf("lab: %s is a QEMU guest: it migrates live (MigrateGuest), it is not re-plugged", vm)
	}
	src, dst := pl.Host(from), pl.Host(to)
	if src == nil || dst == nil {
		return nil, fmt.Errorf("lab: move %s from %q to %q: no such host", vm, from, to)
	}
	if len(dst.Uplinks) == 0 {
		return nil, fmt.Errorf("lab: host %s has no uplink", to)
	}
	var l []string
	for _, n := range v.NICs {
		br := dst.Uplinks[0].Bridge
		for _, u := range dst.Uplinks {
			if u.Name == n.Uplink {
				br = u.Bridge
			}
		}
		if from != to {
			l = append(l, fmt.Sprintf("-n %s link set %s netns %s", src.Name, n.HostDev, dst.Name))
		}
		l = append(l, fmt.Sprintf("-n %s link set %s master %s up", dst.Name, n.HostDev, br))
	}
	return l, nil
}

// WhereIs returns the host whose namespace holds vm's first vNIC's
// host-side veth now ("" when none does).
func (pl *Plan) WhereIs(vm string) (string, error) {
	v := pl.VM(vm)
	if v == nil {
		return "", fmt.Errorf("lab: no VM %q", vm)
	}
	if len(v.NICs) == 0 {
		return "", nil
	}
	for _, h := range pl.Hosts {
		if exec.Command("ip", "-n", h.Name, "link", "show", "dev", v.NICs[0].HostDev).Run() == nil {
			return h.Host, nil
		}
	}
	return "", nil
}

// Move re-plugs vm's vNICs to host to, from wherever they are now.
// Moving a VM to where it is already makes sure its veths are ports of
// the right bridge and up; running Move twice changes nothing. A QEMU
// guest migrates live instead (MigrateGuest, within MigrationTimeout).
func (pl *Plan) Move(vm, to string) error {
	if v := pl.VM(vm); v != nil && v.Kind == policy.LabQemu {
		ctx, cancel := context.WithTimeout(context.Background(), MigrationTimeout)
		defer cancel()
		_, err := pl.MigrateGuest(ctx, vm, to)
		return err
	}
	from, err := pl.WhereIs(vm)
	if err != nil {
		return err
	}
	if from == "" {
		return fmt.Errorf("lab: the vNICs of %s are on no host of cluster %s (is the lab up?)", vm, pl.Cluster)
	}
	lines, err := pl.MoveLines(vm, from, to)
	if err != nil {
		return err
	}
	return batch(lines)
}
