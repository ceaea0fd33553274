package lab

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
)

// The storage network (issue 26). The datastores are attached to the
// bridge StorageBridge in the storage namespace and to nothing else; each
// host namespace has a veth to it (HostStorageDev, its StorageIP) from
// which its gateway reaches them. The VMs' network (PrefixLen) does not
// include the storage network's addresses, no namespace of the lab
// forwards (noForwarding), and the storage bridge has no address: a VM,
// even one that adds routes of its own, cannot reach a datastore, whose
// NBD server has neither the gateway's access control nor its limits. As
// on a real host, a VM reaches its disks only through its host's gateway.

// storageLines returns the `ip -batch` lines (batch's "-n NS" form) that
// build the storage network: its bridge, the datastores' veths with their
// addresses and the hosts' storage veths with theirs.
func (pl *Plan) storageLines() []string {
	s := pl.Storage.Name
	cidr := func(a fmt.Stringer) string { return fmt.Sprintf("%s/%d", a, StoragePrefixLen) }
	l := []string{
		fmt.Sprintf("-n %s link add %s type bridge", s, StorageBridge),
		fmt.Sprintf("-n %s link set %s up", s, StorageBridge),
	}
	for _, d := range pl.Datastores {
		l = append(l,
			fmt.Sprintf("-n %s link add %s type veth peer name %s netns %s", s, d.StorageDev, d.Dev, d.Name),
			fmt.Sprintf("-n %s link set %s master %s up", s, d.StorageDev, StorageBridge),
			fmt.Sprintf("-n %s addr add %s dev %s", d.Name, cidr(d.IP), d.Dev),
			fmt.Sprintf("-n %s link set %s up", d.Name, d.Dev))
	}
	for _, h := range pl.Hosts {
		l = append(l,
			fmt.Sprintf("-n %s link add %s type veth peer name %s netns %s", s, h.StoragePeer, HostStorageDev, h.Name),
			fmt.Sprintf("-n %s link set %s master %s up", s, h.StoragePeer, StorageBridge),
			fmt.Sprintf("-n %s addr add %s dev %s", h.Name, cidr(h.StorageIP), HostStorageDev),
			fmt.Sprintf("-n %s link set %s up", h.Name, HostStorageDev))
	}
	return l
}

// forwardingSysctls are the switches of IP forwarding in a network
// namespace (ip_forward sets every device's IPv4 forwarding too).
var forwardingSysctls = []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"}

// noForwarding turns IPv4 and IPv6 forwarding off in the named network
// namespace. A new namespace inherits the IPv4 setting of the machine's,
// which a libvirt host (its NAT network) typically has on.
//
// /proc/sys/net is the calling thread's namespace's, so one locked thread
// enters the namespace, writes and comes back before it is unlocked. It
// must come back: Go does not end the main thread when a goroutine locked
// to it exits, and a process whose main thread stayed in a lab namespace
// is among that namespace's processes (`ip netns pids`), which Down kills
// (a test that ran Up and Down in its own process killed itself so).
func noForwarding(ns string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("forwarding off in %s: this thread's namespace: %w", ns, err)
			return
		}
		defer back.Close()
		h, err := netns.GetFromName(ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("forwarding off in %s: %w", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("forwarding off in %s: setns: %w", ns, err)
			return
		}
		var errs []error
		for _, f := range forwardingSysctls {
			if err := os.WriteFile(f, []byte("0\n"), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("forwarding off in %s: %w", ns, err))
			}
		}
		if err := netns.Set(back); err != nil {
			// Still in ns: the thread stays locked, and Go ends it with
			// this goroutine (a main thread would stay, see above).
			errs = append(errs, fmt.Errorf("forwarding off in %s: back to this process's namespace: %w", ns, err))
		} else {
			runtime.UnlockOSThread()
		}
		errc <- errors.Join(errs...)
	}()
	return <-errc
}
