package labstorage

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/lab"
)

// Two hosts, a VM with a vNIC and a disk on each, one datastore.
const isolationYAML = `cluster: lsi
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
  - name: h2
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    array: {slots: 4, serviceTime: 1ms}
vms:
  - {name: vm1, host: h1, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1, size: 16MiB}]}
  - {name: vm2, host: h2, nics: [{name: nic0}], disks: [{name: d0, datastore: ds1, size: 16MiB}]}
`

// vmHost is the host of each VM of isolationYAML.
var vmHost = map[string]string{"vm1": "h1", "vm2": "h2"}

// nbdinfoWithin bounds each nbdinfo run; a connection that has not
// failed by then has not connected either.
const nbdinfoWithin = 5 * time.Second

// TestVMsCannotReachDatastores (issue 26): a VM must reach its disks only
// through its host's gateway, whose access control and limits a direct
// connection to the datastore would bypass. From each VM's namespace:
//
//   - `nbdinfo --list nbd://DATASTORE:10809`, as the issue did, fails
//     (before the lab had a storage network it listed every volume, vm2's
//     included), and the VM has no route to the datastore;
//   - with a route of its own to the datastore through its host's or the
//     fabric's address (a guest is root in its own network), it still
//     cannot connect: no namespace forwards between the networks;
//   - fio writes and verifies the VM's disk through its gateway socket, so
//     the gateway reaches the datastore.
//
// Each host reaches the datastore on the storage network (nbdinfo lists
// the volumes there), not through the bridge its VMs are on, and every
// namespace of the lab has IPv4 and IPv6 forwarding off.
func TestVMsCannotReachDatastores(t *testing.T) {
	requireLive(t)
	if _, err := exec.LookPath("nbdinfo"); err != nil {
		t.Fatal("the test needs nbdinfo (libnbd-bin; scripts/deps.sh installs it)")
	}
	l := upLab(t, isolationYAML)
	var dsAddr string
	hostAddr, hostDev, vmNS, vmURI := map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}
	fabricAddr := ""
	for _, ns := range l.status.Namespaces {
		switch {
		case ns.Role == lab.RoleDatastore && ns.Entity == "ds1" && len(ns.Addresses) > 0:
			dsAddr = ns.Addresses[0].IP
		case ns.Role == lab.RoleFabric && len(ns.Addresses) > 0:
			fabricAddr = ns.Addresses[0].IP
		case ns.Role == lab.RoleHost && len(ns.Addresses) > 0:
			// The first address is on the bridge of the host's first
			// uplink, where its VMs' vNICs are.
			hostAddr[ns.Entity], hostDev[ns.Entity] = ns.Addresses[0].IP, ns.Addresses[0].Dev
		case ns.Role == lab.RoleVM && len(ns.Disks) == 1:
			vmNS[ns.Entity], vmURI[ns.Entity] = ns.Name, ns.Disks[0].URI
		}
	}
	if dsAddr == "" || fabricAddr == "" || len(hostAddr) != 2 || len(vmNS) != 2 {
		t.Fatalf("lab status lacks the datastore's, the fabric's, the hosts' or the VMs' entries: %+v", l.status.Namespaces)
	}
	dsURI := fmt.Sprintf("nbd://%s:%d", dsAddr, lab.NBDPort)
	t.Logf("datastore ds1 at %s", dsURI)

	for _, vm := range []string{"vm1", "vm2"} {
		ns := vmNS[vm]
		if out, err := nbdinfoList(ns, dsURI); err == nil {
			t.Errorf("%s lists the datastore's volumes at %s (it bypasses the gateway): %s", vm, dsURI, exports(out))
		} else {
			t.Logf("%s: nbdinfo --list %s: %v", vm, dsURI, err)
		}
		if out, err := exec.Command("ip", "-n", ns, "route", "get", dsAddr).CombinedOutput(); err == nil {
			t.Errorf("%s has a route to the datastore %s: %s", vm, dsAddr, strings.TrimSpace(string(out)))
		}
		// Its own disk, through its host's gateway (which reaches the
		// datastore on the storage network).
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		fio := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "fio", "--name=own", "--ioengine=nbd", "--uri="+vmURI[vm],
			"--rw=randwrite", "--bs=4k", "--iodepth=4", "--size=4M", "--verify=crc32c", "--do_verify=1", "--output-format=terse")
		fio.Dir = l.dir
		out, err := fio.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("fio in %s on its disk %s: %v\n%s", vm, vmURI[vm], err, out)
		}
	}

	// A guest may add routes: through its host, or the fabric. Each probe
	// waits nbdinfoWithin for a connection that must not come, so the two
	// VMs probe at once, one through each, then the other way round.
	vias := map[string][]string{}
	for _, vm := range []string{"vm1", "vm2"} {
		vias[vm] = []string{hostAddr[vmHost[vm]], fabricAddr}
	}
	for round := range 2 {
		var wg sync.WaitGroup
		for i, vm := range []string{"vm1", "vm2"} {
			ns, via := vmNS[vm], vias[vm][(i+round)%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out, err := exec.Command("ip", "-n", ns, "route", "replace", dsAddr+"/32", "via", via).CombinedOutput(); err != nil {
					t.Errorf("%s: ip route replace %s via %s: %v: %s", vm, dsAddr, via, err, out)
					return
				}
				if out, err := nbdinfoList(ns, dsURI); err == nil {
					t.Errorf("%s lists the datastore's volumes through %s (a namespace forwards to the storage network): %s", vm, via, exports(out))
				} else {
					t.Logf("%s with a route through %s: nbdinfo --list: %v", vm, via, err)
				}
				if out, err := exec.Command("ip", "-n", ns, "route", "del", dsAddr+"/32").CombinedOutput(); err != nil {
					t.Errorf("%s: ip route del %s: %v: %s", vm, dsAddr, err, out)
				}
			}()
		}
		wg.Wait()
	}

	for _, h := range []string{"h1", "h2"} {
		ns := lab.NamespacePrefix("lsi") + h
		out, err := nbdinfoList(ns, dsURI)
		if err != nil || !strings.Contains(out, "vm1+d0.img") || !strings.Contains(out, "vm2+d0.img") {
			t.Errorf("host %s does not list the datastore's volumes at %s: %v\n%s", h, dsURI, err, out)
		} else {
			t.Logf("host %s lists %s", h, exports(out))
		}
		route, err := exec.Command("ip", "-n", ns, "route", "get", dsAddr).CombinedOutput()
		if err != nil || strings.Contains(string(route), "dev "+hostDev[h]+" ") {
			t.Errorf("host %s reaches the datastore through the bridge of its VMs (%s) or not at all: %v %s", h, hostDev[h], err, route)
		} else {
			t.Logf("host %s: %s", h, strings.TrimSpace(string(route)))
		}
	}

	for _, ns := range l.status.Namespaces {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			out, err := exec.Command("ip", "netns", "exec", ns.Name, "cat", f).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "0" {
				t.Errorf("%s (%s): %s is %q, want 0 (%v)", ns.Name, ns.Role, f, strings.TrimSpace(string(out)), err)
			}
		}
	}
}

// exports are the export names in nbdinfo --list's output.
func exports(out string) string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "export=") {
			names = append(names, strings.TrimSuffix(strings.TrimPrefix(line, "export="), ":"))
		}
	}
	return strings.Join(names, " ")
}

// nbdinfoList runs `nbdinfo --list uri` in namespace ns for at most
// nbdinfoWithin and returns its output; a run that has not ended by then
// is an error.
func nbdinfoList(ns, uri string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nbdinfoWithin)
	defer cancel()
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nbdinfo", "--list", uri).CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("no connection after %v", nbdinfoWithin)
	}
	if err != nil {
		return string(out), fmt.Errorf("%v after %v: %s", err, time.Since(t0).Round(time.Millisecond), strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
