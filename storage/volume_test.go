package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/policy"
	"sluice/storage/nbd"
)

// twoVMPolicy places vm1 and vm2 (one 8 MiB disk each) on h1, hosts h1
// and h2; %s are replaced to reorder it.
const reorderA = `
cluster: vol
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
  - {name: h2, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 8MiB}, {name: d1, datastore: ds1, size: 4MiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 8MiB}]}
`

// reorderB is reorderA with hosts and VMs in the opposite order, vm1's
// disks swapped, and a new VM first.
const reorderB = `
cluster: vol
hosts:
  - {name: h2, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm0, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 16MiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d0, datastore: ds1, size: 8MiB}]}
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: d1, datastore: ds1, size: 4MiB}, {name: d0, datastore: ds1, size: 8MiB}]}
`

// gatewayOn serves host's disks of p from datastore ds1 at loc on
// 127.0.0.1 until the test ends.
func gatewayOn(t *testing.T, p *policy.Policy, host, loc string, opts Options) (*Gateway, string) {
	t.Helper()
	opts.Host, opts.Policy, opts.Datastores = host, p, map[string]string{"ds1": loc}
	if opts.Period == 0 {
		opts.Period = time.Hour
	}
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(l)
	t.Cleanup(func() { g.Close() })
	return g, l.Addr().String()
}

func dial(t *testing.T, addr, export string) *nbd.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "tcp", addr, export)
	if err != nil {
		t.Fatalf("open %s: %v", export, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func block(tag string) []byte {
	return bytes.Repeat([]byte(tag+"|"), 4096/(len(tag)+1)+1)[:4096]
}

// Reordering hosts, VMs and disks in the policy, and adding a VM in
// front, moves no data: each disk is its own volume file, named after the
// VM and the disk, and the new gateway reads what the old one wrote.
func TestReorderedPolicyMovesNoData(t *testing.T) {
	pa, pb := parsePolicy(t, reorderA), parsePolicy(t, reorderB)
	dir := t.TempDir()
	if _, err := CreateVolumes(dir, pa, "ds1"); err != nil {
		t.Fatal(err)
	}
	g, addr := gatewayOn(t, pa, "h1", "dir:"+dir, Options{})
	disks := []string{"vm1/d0", "vm1/d1", "vm2/d0"}
	for _, d := range disks {
		c := dial(t, addr, d)
		if err := c.WriteAt(block(d), 8192, false); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	g.Close()
	// The volume files hold the data at the VM's offsets.
	for _, d := range disks {
		vm, dk, _ := strings.Cut(d, "/")
		b, err := os.ReadFile(filepath.Join(dir, VolumeName(vm, dk)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[8192:8192+4096], block(d)) {
			t.Errorf("volume %s does not hold %s's data at offset 8192", VolumeName(vm, dk), d)
		}
	}
	// The reordered policy, with a new VM first: its volume is created,
	// the others are kept as they are.
	created, err := CreateVolumes(dir, pb, "ds1")
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != 1 || created[0] != VolumeName("vm0", "d0") {
		t.Errorf("created %v, want only vm0+d0.img", created)
	}
	_, addr = gatewayOn(t, pb, "h1", "dir:"+dir, Options{})
	buf := make([]byte, 4096)
	for _, d := range disks {
		if err := dial(t, addr, d).ReadAt(buf, 8192); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, block(d)) {
			t.Errorf("%s after reordering the policy: data moved (read %q…)", d, buf[:16])
		}
	}
}

// A volume that is missing or smaller than its disk stops the gateway
// with an error naming it; so does a directory that was never prepared.
func TestMissingOrSmallVolume(t *testing.T) {
	p := parsePolicy(t, reorderA)
	dir := t.TempDir()
	if _, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "dir:" + dir}}); err == nil ||
		!strings.Contains(err.Error(), StatsVolume) || !strings.Contains(err.Error(), "sluice datastore create") {
		t.Errorf("unprepared directory: %v", err)
	}
	if _, err := CreateVolumes(dir, p, "ds1"); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, VolumeName("vm2", "d0")))
	_, err := New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "dir:" + dir}})
	if err == nil || !strings.Contains(err.Error(), "vm2/d0") || !strings.Contains(err.Error(), "vm2+d0.img") || !errors.Is(err, errMissing) {
		t.Errorf("missing volume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, VolumeName("vm2", "d0")), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = New(Options{Host: "h1", Policy: p, Datastores: map[string]string{"ds1": "dir:" + dir}})
	if err == nil || !strings.Contains(err.Error(), "has 4096 bytes, the disk needs 8388608") {
		t.Errorf("small volume: %v", err)
	}
	if _, err := CreateVolumes(dir, p, "ds1"); err == nil || !strings.Contains(err.Error(), "vm2+d0.img has 4096 bytes") {
		t.Errorf("CreateVolumes over a small volume: %v", err)
	}
}

// Two hosts whose policy files list the hosts in opposite orders share the
// stats volume: each finds its own slot by name, sees the other, and
// neither overwrites the other's record.
func TestStatsSlotsByHostName(t *testing.T) {
	pa, pb := parsePolicy(t, reorderA), parsePolicy(t, reorderB)
	dir := t.TempDir()
	if _, err := CreateVolumes(dir, pb, "ds1"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]chan Status{"h1": make(chan Status, 100), "h2": make(chan Status, 100)}
	gatewayOn(t, pa, "h1", "dir:"+dir, Options{Period: 20 * time.Millisecond, OnPeriod: func(s Status) { seen["h1"] <- s }})
	gatewayOn(t, pb, "h2", "dir:"+dir, Options{Period: 20 * time.Millisecond, OnPeriod: func(s Status) { seen["h2"] <- s }})
	deadline := time.After(10 * time.Second)
	for _, h := range []string{"h1", "h2"} {
		for ok := 0; ok < 5; {
			select {
			case s := <-seen[h]:
				if s.Datastores[0].HostsSeen == 2 {
					ok++ // five periods in a row see both hosts
				} else {
					ok = 0
				}
			case <-deadline:
				t.Fatalf("%s never saw both hosts' records", h)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, StatsVolume))
	if err != nil {
		t.Fatal(err)
	}
	slots := map[string]int{}
	for k := 0; k < statsSlots; k++ {
		off := statsHeaderBytes + k*StatsSlotBytes
		if r, ok := decodeStatsRecord(b[off : off+StatsSlotBytes]); ok {
			if _, dup := slots[r.Host]; dup {
				t.Errorf("host %s holds two slots", r.Host)
			}
			slots[r.Host] = k
		}
	}
	if len(slots) != 2 || slots["h1"] == slots["h2"] {
		t.Errorf("slots %v, want one each for h1 and h2", slots)
	}
}

// A VM that moves from h1 to h2 (both gateways get the new policy) is
// served by h2's gateway from the same volume, without copying: what the
// VM wrote through h1, flushed or not, reads back through h2, and h1 no
// longer serves it.
// movePair is two gateways, h1 and h2, on one directory datastore, with
// reorderA in force (vm2 on h1) and moved the policy that puts vm2 on h2.
type movePair struct {
	moved        *policy.Policy
	dir          string
	g1, g2       *Gateway
	addr1, addr2 string
}

func newMovePair(t *testing.T, opts1 Options) movePair {
	t.Helper()
	pa := parsePolicy(t, reorderA)
	m := movePair{moved: parsePolicy(t, strings.Replace(reorderA, "{name: vm2, host: h1", "{name: vm2, host: h2", 1)), dir: t.TempDir()}
	if _, err := CreateVolumes(m.dir, pa, "ds1"); err != nil {
		t.Fatal(err)
	}
	m.g1, m.addr1 = gatewayOn(t, pa, "h1", "dir:"+m.dir, opts1)
	m.g2, m.addr2 = gatewayOn(t, pa, "h2", "dir:"+m.dir, Options{})
	return m
}

func TestVMMovesBetweenGateways(t *testing.T) {
	m := newMovePair(t, Options{})
	moved, g1, g2, addr1, addr2 := m.moved, m.g1, m.g2, m.addr1, m.addr2
	if len(g2.Exports()) != 0 {
		t.Fatalf("h2 serves %v before the move", g2.Exports())
	}
	if err := dial(t, addr1, "vm2/d0").WriteAt(block("before the move"), 0, false); err != nil {
		t.Fatal(err)
	}
	// The source lets go first, then the destination opens. (The VM's
	// connection to h1 stays open, so h1 serves it on until it closes:
	// TestLeavingDiskServesOpenConnections.)
	if err := g1.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	if err := g2.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(g2.Exports(), " "); got != "vm2/d0" {
		t.Errorf("h2 serves %q after the move, want vm2/d0", got)
	}
	if got := strings.Join(g1.Exports(), " "); got != "vm1/d0 vm1/d1" {
		t.Errorf("h1 serves %q after the move, want vm1/d0 vm1/d1", got)
	}
	buf := make([]byte, 4096)
	if err := dial(t, addr2, "vm2/d0").ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, block("before the move")) {
		t.Errorf("h2 reads %q…, not what the VM wrote through h1", buf[:16])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := nbd.Dial(ctx, "tcp", addr1, "vm2/d0"); err == nil {
		c.Close()
		t.Error("h1 still serves vm2/d0 after it moved")
	}
}

// The gateways of a move follow the placement each on its own (the
// controller does not order them): here the destination opens the volume
// first, the source's VM writes on, and the source lets go last. The
// source's acknowledged writes left no page of the volume in the host's
// page cache (O_DIRECT: on NFS they are on the server, not in the source
// host's cache), and the destination reads them.
func TestVMMovesDestinationFirst(t *testing.T) {
	m := newMovePair(t, Options{})
	moved, dir, g1, g2, addr1, addr2 := m.moved, m.dir, m.g1, m.g2, m.addr1, m.addr2
	if err := g2.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	src := dial(t, addr1, "vm2/d0")
	for i := range 64 {
		if err := src.WriteAt(block(fmt.Sprintf("block %d, written through h1", i)), uint64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := residentPages(t, filepath.Join(dir, VolumeName("vm2", "d0"))); n != 0 {
		t.Errorf("%d pages of vm2's volume are in this host's page cache after h1 acknowledged the writes, want 0", n)
	}
	if err := g1.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	dst := dial(t, addr2, "vm2/d0")
	buf := make([]byte, 4096)
	for i := range 64 {
		if err := dst.ReadAt(buf, uint64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if want := block(fmt.Sprintf("block %d, written through h1", i)); !bytes.Equal(buf, want) {
			t.Fatalf("h2 reads block %d as %q…, not what the VM wrote through h1", i, buf[:24])
		}
	}
}

// A disk whose VM left is served on to the connections that have it open
// (the source QEMU of a live migration runs until the migration
// completes), while the destination serves it too: SetPolicy does not
// wait for them, no new connection may open the disk, a write through the
// old connection is read at the destination, and when the connection
// closes the source flushes and closes the volume.
func TestLeavingDiskServesOpenConnections(t *testing.T) {
	logs := make(chan string, 64)
	m := newMovePair(t, Options{Logf: func(f string, a ...any) {
		select {
		case logs <- fmt.Sprintf(f, a...):
		default:
		}
	}})
	moved, g1, g2, addr1, addr2 := m.moved, m.g1, m.g2, m.addr1, m.addr2
	src := dial(t, addr1, "vm2/d0")
	if err := src.WriteAt(block("before the move"), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := g1.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	if err := g2.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	if err := src.WriteAt(block("during the move"), 4096, false); err != nil {
		t.Fatalf("h1 failed a write of the connection that had vm2/d0 open before the move: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := nbd.Dial(ctx, "tcp", addr1, "vm2/d0"); err == nil {
		c.Close()
		t.Error("h1 let a new connection open vm2/d0 after it moved")
	}
	dst := dial(t, addr2, "vm2/d0")
	buf := make([]byte, 8192)
	if err := dst.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:4096], block("before the move")) || !bytes.Equal(buf[4096:], block("during the move")) {
		t.Errorf("h2 reads %q… and %q…, not what the VM wrote through h1", buf[:16], buf[4096:4112])
	}
	src.Close()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l := <-logs:
			if l == "gateway: disk vm2/d0 no longer served here" {
				return
			}
		case <-deadline:
			t.Fatal("h1 did not release vm2/d0 within 10 s of its last connection closing")
		}
	}
}

// restartable is an NBD datastore on a Unix socket that can be stopped
// (its connections drop) and started again with other contents.
type restartable struct {
	sock string
	srv  *nbd.Server
}

func (r *restartable) start(t *testing.T, ex nbd.MapExports) {
	t.Helper()
	os.Remove(r.sock)
	l, err := net.Listen("unix", r.sock)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = &nbd.Server{Exports: ex}
	go r.srv.Serve(l)
}

func (r *restartable) stop() { r.srv.Close() }

func exportsOf(m memVolumes) nbd.MapExports {
	ex := nbd.MapExports{}
	for n, v := range m {
		ex[n] = v
	}
	return ex
}

// After the datastore restarts, a disk with writes acknowledged since its
// last flush gets EIO on its next FLUSH (the old server may have held them
// only in a cache), and on every FLUSH after that; a disk whose writes
// were all flushed, or written with FUA, goes on without an error.
func TestFlushFailsAfterDatastoreRestart(t *testing.T) {
	p := parsePolicy(t, oneHostPolicy)
	vols := newMemVolumes(p)
	ds := &restartable{sock: filepath.Join(t.TempDir(), "ds.sock")}
	ds.start(t, exportsOf(vols))
	g, addr := gatewayOn(t, p, "h1", "nbd+unix:///?socket="+ds.sock, Options{})
	a, b, c := dial(t, addr, "a/d0"), dial(t, addr, "b/d0"), dial(t, addr, "c/d0")
	for _, x := range []*nbd.Client{a, b} {
		if err := x.WriteAt(block("flushed"), 0, false); err != nil {
			t.Fatal(err)
		}
		if err := x.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.WriteAt(block("not flushed"), 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(block("fua"), 0, true); err != nil {
		t.Fatal(err)
	}
	ds.stop()
	ds.start(t, exportsOf(vols))
	if err := a.Flush(); err == nil {
		t.Error("a/d0: FLUSH succeeded after the datastore restarted with a write acknowledged and not flushed")
	}
	if err := a.Flush(); err == nil {
		t.Error("a/d0: a second FLUSH succeeded: the error must stay")
	}
	for name, x := range map[string]*nbd.Client{"b/d0": b, "c/d0": c} {
		if err := x.WriteAt(block("after"), 8192, false); err != nil {
			t.Errorf("%s: write after the restart: %v", name, err)
		}
		if err := x.Flush(); err != nil {
			t.Errorf("%s: FLUSH after the restart, nothing unflushed before it: %v", name, err)
		}
	}
	for _, d := range g.Status().Disks {
		if (d.Disk == "a/d0") != (d.Error != "") {
			t.Errorf("status of %s: error %q", d.Disk, d.Error)
		}
	}
}

// A datastore that comes back empty (no identity in its stats volume) or
// replaced by another (another identity) makes every request fail, rather
// than serve zeroes or another datastore's data.
func TestDatastoreReplacedFails(t *testing.T) {
	for _, tc := range []string{"empty", "replaced"} {
		t.Run(tc, func(t *testing.T) {
			p := parsePolicy(t, oneHostPolicy)
			ds := &restartable{sock: filepath.Join(t.TempDir(), "ds.sock")}
			ds.start(t, exportsOf(newMemVolumes(p)))
			g, addr := gatewayOn(t, p, "h1", "nbd+unix:///?socket="+ds.sock, Options{})
			a := dial(t, addr, "a/d0")
			if err := a.WriteAt(block("x"), 0, true); err != nil {
				t.Fatal(err)
			}
			ds.stop()
			other := newMemVolumes(p)
			if tc == "empty" {
				clear(other[StatsVolume].data)
			} else {
				copy(other[StatsVolume].data, encodeHeader(datastoreID{9}))
			}
			ds.start(t, exportsOf(other))
			buf := make([]byte, 4096)
			if err := a.ReadAt(buf, 0); err == nil {
				t.Fatalf("read from a datastore that came back %s succeeded (%q…)", tc, buf[:8])
			}
			if err := dial(t, addr, "b/d0").WriteAt(buf, 0, false); err == nil {
				t.Error("another disk of the datastore still writes")
			}
			if st := g.Status(); len(st.Datastores) != 1 || !strings.Contains(st.Datastores[0].Error, "datastore") {
				t.Errorf("status: %+v", st.Datastores)
			}
		})
	}
}
