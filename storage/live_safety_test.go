package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/storage/nbd"
)

const safetyPolicy = `
cluster: st2
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 5ms, controlPeriod: 1s}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, shares: 1000, size: 64MiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, shares: 2000, size: 64MiB}]}
`

// TestLiveNoDataLost: several fio writers (crc32c verify headers) write
// through the gateway, then reconnecting writers keep writing and flushing
// while the gateway is restarted under them; afterwards fio verifies every
// block it wrote (verify_only, through the new gateway) and the reconnecting
// writers read back every block they had acknowledged. A lost or torn write
// fails the test.
func TestLiveNoDataLost(t *testing.T) {
	needTools(t, "nbdkit", "fio")
	p := parsePolicy(t, safetyPolicy)
	uri := startNbdkit(t, Array{Dir: prepareDatastore(t, p), ServiceTime: time.Millisecond, Threads: 16})
	dss := map[string]string{"ds1": uri}
	gw := startGateway(t, p, "h1", dss, 200*time.Millisecond, "")
	addr := gw.addr

	// fio: 4 writers on vm1/disk0, each its own 8 MiB region.
	var jobs []fioJob
	for i := 0; i < 4; i++ {
		jobs = append(jobs, fioJob{name: fmt.Sprintf("w%d", i), uri: fmt.Sprintf("nbd://%s/vm1/disk0", addr), rw: "randwrite", bs: "4k", iodepth: 8,
			extra: []string{fmt.Sprintf("offset=%dM", 8*i), "size=8M", "verify=crc32c", "do_verify=0", "randrepeat=1", "end_fsync=1"}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := runFio(ctx, t, nil, jobs); err != nil {
		t.Fatalf("fio writers: %v", err)
	}

	// Reconnecting writers on vm2/disk0 across a gateway restart.
	const writers, blocks = 4, 400
	var acked [writers]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- reconnectingWriter(addr, "vm2/disk0", w, blocks, &acked[w], stop)
		}()
	}
	// Restart once every writer has acknowledged some blocks (polling).
	deadline := time.Now().Add(30 * time.Second)
	for !allAbove(acked[:], 50) {
		if time.Now().After(deadline) {
			t.Fatal("writers made no progress before the restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := sumAcked(acked[:])
	gw.g.Close()
	gw2 := startGateway(t, p, "h1", dss, 200*time.Millisecond, addr)
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("reconnecting writers: %d blocks acknowledged before the restart, %d in all", before, sumAcked(acked[:]))
	if before >= writers*blocks {
		t.Fatal("the restart happened after the writers finished: nothing tested")
	}

	// fio verifies what it wrote before the restart, through the new gateway.
	for i := range jobs {
		jobs[i].uri = fmt.Sprintf("nbd://%s/vm1/disk0", gw2.addr)
		jobs[i].extra = []string{fmt.Sprintf("offset=%dM", 8*i), "size=8M", "verify=crc32c", "do_verify=1", "verify_only=1", "randrepeat=1"}
	}
	res, err := runFio(ctx, t, nil, jobs)
	if err != nil {
		t.Fatalf("fio verify (a verify error shows here): %v", err)
	}
	expectNoFioErrors(t, res)
	// The reconnecting writers' blocks.
	c, err := nbd.Dial(ctx, "tcp", gw2.addr, "vm2/disk0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	for w := 0; w < writers; w++ {
		for i := 0; i < blocks; i++ {
			if err := c.ReadAt(buf, blockOff(w, i)); err != nil {
				t.Fatal(err)
			}
			if want := pattern(w, i); !bytes.Equal(buf, want) {
				t.Fatalf("writer %d block %d: data lost or torn after the gateway restart", w, i)
			}
		}
	}
}

func blockOff(w, i int) uint64 { return uint64(w*1000+i) * 4096 }

func pattern(w, i int) []byte {
	b := make([]byte, 4096)
	for k := 0; k < len(b); k += 16 {
		binary.BigEndian.PutUint64(b[k:], uint64(w))
		binary.BigEndian.PutUint64(b[k+8:], uint64(i)^0x5a5a5a5a)
	}
	return b
}

// reconnectingWriter writes blocks 0..n-1 with a unique pattern each, FUA
// every 8th and a FLUSH every 16th; when the connection fails (or the
// server answers ESHUTDOWN) it dials again (until a deadline) and repeats
// the write that was not acknowledged.
func reconnectingWriter(addr, export string, w, n int, acked *atomic.Int64, stop chan struct{}) error {
	var c *nbd.Client
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; {
		if c == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			var err error
			c, err = nbd.Dial(ctx, "tcp", addr, export)
			cancel()
			if err != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("writer %d: reconnect: %w", w, err)
				}
				time.Sleep(20 * time.Millisecond) // reconnect back-off
				continue
			}
		}
		err := c.WriteAt(pattern(w, i), blockOff(w, i), i%8 == 0)
		if err == nil && i%16 == 15 {
			err = c.Flush()
		}
		var ne *nbd.Error
		if errors.As(err, &ne) && ne.Errno != nbd.ESHUTDOWN {
			return fmt.Errorf("writer %d block %d: %w", w, i, err)
		}
		if err != nil {
			c.Close()
			c = nil
			continue
		}
		i++
		acked.Store(int64(i))
		time.Sleep(2 * time.Millisecond) // pace the writer so the restart lands mid-run
	}
	if c != nil {
		c.Close()
	}
	return nil
}

func allAbove(a []atomic.Int64, n int64) bool {
	for i := range a {
		if a[i].Load() < n {
			return false
		}
	}
	return true
}

func sumAcked(a []atomic.Int64) int64 {
	var s int64
	for i := range a {
		s += a[i].Load()
	}
	return s
}

const largePolicy = `
cluster: st3
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, size: 1GiB}]}
`

// TestLiveLargeIO: 16 MiB writes and reads at queue depth 32 from eight
// connections (far more bytes in flight than socket buffers hold) through
// the gateway; the writers then read back and verify. The gateway's
// upstream client once deadlocked here: its reply reader could be a caller
// blocked writing its own request, while nbdkit, its threads blocked on
// replies nobody read, stopped reading requests.
func TestLiveLargeIO(t *testing.T) {
	needTools(t, "nbdkit", "fio")
	p := parsePolicy(t, largePolicy)
	uri := startNbdkit(t, Array{Dir: prepareDatastore(t, p), Threads: 16})
	gw := startGateway(t, p, "h1", map[string]string{"ds1": uri}, 200*time.Millisecond, "")
	var jobs []fioJob
	for i := 0; i < 8; i++ {
		j := fioJob{name: fmt.Sprintf("r%d", i), uri: fmt.Sprintf("nbd://%s/vm1/disk0", gw.addr), rw: "randread", bs: "16M", iodepth: 32,
			extra: []string{fmt.Sprintf("offset=%dM", 128*i), "size=128M", "time_based=1", "runtime=8"}}
		if i%2 == 0 {
			j.name, j.rw = fmt.Sprintf("w%d", i), "randwrite"
			j.extra = []string{fmt.Sprintf("offset=%dM", 128*i), "size=128M", "loops=4", "verify=crc32c", "do_verify=1"}
		}
		jobs = append(jobs, j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := runFio(ctx, t, nil, jobs)
	if err != nil {
		t.Fatalf("fio with 16 MiB I/Os at queue depth 32 (a deadlock ends in the 60 s timeout): %v", err)
	}
	expectNoFioErrors(t, res)
}

// TestLiveDatastoreRestart: writers write and flush through the gateway
// while the datastore (nbdkit serving a directory of volumes) is killed
// with SIGKILL and started again on the same directory. A writer whose
// flush fails stops there (a guest file system would go read-only); every
// block a writer saw acknowledged must read back afterwards, whether it
// saw an error or not. Then the datastore is killed again and started on
// another, freshly prepared directory (a datastore replaced or come back
// empty): the gateway must fail the disks' requests instead of serving the
// new datastore's zeroes.
func TestLiveDatastoreRestart(t *testing.T) {
	needTools(t, "nbdkit", "fio")
	p := parsePolicy(t, safetyPolicy)
	dir := prepareDatastore(t, p)
	sock := filepath.Join(t.TempDir(), "ds.sock")
	arr := Array{Dir: dir, ServiceTime: time.Millisecond, Threads: 16}
	uri, ds := startNbdkitCmd(t, arr, sock)
	gw := startGateway(t, p, "h1", map[string]string{"ds1": uri}, 200*time.Millisecond, "")

	const writers, blocks = 4, 300
	var acked [writers]atomic.Int64
	var sawErr [writers]atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flushingWriter(gw.addr, "vm1/disk0", w, blocks, &acked[w], &sawErr[w])
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for !allAbove(acked[:], 30) {
		if time.Now().After(deadline) {
			t.Fatal("writers made no progress before the datastore's restart")
		}
		time.Sleep(10 * time.Millisecond) // polling the writers' progress
	}
	before := sumAcked(acked[:])
	ds.Process.Kill()
	ds.Wait()
	_, ds = startNbdkitCmd(t, arr, sock)
	wg.Wait()
	if before >= writers*blocks {
		t.Fatal("the restart happened after the writers finished: nothing tested")
	}
	errs := 0
	for w := range sawErr {
		if e, _ := sawErr[w].Load().(string); e != "" {
			errs++
			t.Logf("writer %d stopped at block %d: %s", w, acked[w].Load(), e)
		}
	}
	t.Logf("datastore restarted after %d acknowledged blocks; %d of %d writers saw an error, %d blocks acknowledged in all", before, errs, writers, sumAcked(acked[:]))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "tcp", gw.addr, "vm1/disk0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	for w := 0; w < writers; w++ {
		for i := 0; i < int(acked[w].Load()); i++ {
			if err := c.ReadAt(buf, blockOff(w, i)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, pattern(w, i)) {
				t.Fatalf("writer %d block %d: acknowledged write lost across the datastore's restart", w, i)
			}
		}
	}

	// Replaced: another datastore directory behind the same address.
	other := prepareDatastore(t, p)
	ds.Process.Kill()
	ds.Wait()
	startNbdkitCmd(t, Array{Dir: other, Threads: 16}, sock)
	start := time.Now()
	if err := c.ReadAt(buf, blockOff(0, 0)); err == nil {
		t.Fatalf("a read from the replaced datastore succeeded (%q…): the VM sees the other datastore's data", buf[:8])
	}
	t.Logf("read from the replaced datastore failed after %s", time.Since(start).Round(time.Millisecond))
	if st := gw.g.Status(); st.Datastores[0].Error == "" {
		t.Errorf("status shows no error for the replaced datastore: %+v", st.Datastores[0])
	} else {
		t.Logf("status: %s", st.Datastores[0].Error)
	}
}

// flushingWriter writes blocks 0..n-1 (pattern) with a FLUSH after every
// 8th; it stops at the first error, which it stores in errSeen.
func flushingWriter(addr, export string, w, n int, acked *atomic.Int64, errSeen *atomic.Value) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := nbd.Dial(ctx, "tcp", addr, export)
	cancel()
	if err != nil {
		errSeen.Store(err.Error())
		return
	}
	defer c.Close()
	for i := 0; i < n; i++ {
		if err := c.WriteAt(pattern(w, i), blockOff(w, i), false); err != nil {
			errSeen.Store(fmt.Sprintf("write: %v", err))
			return
		}
		acked.Store(int64(i + 1))
		if i%8 == 7 {
			if err := c.Flush(); err != nil {
				errSeen.Store(fmt.Sprintf("flush: %v", err))
				return
			}
		}
		time.Sleep(2 * time.Millisecond) // pace the writer so the restart lands mid-run
	}
}

// TestLiveVMMovesWithFio: fio writes vm2's disk (verify headers) through
// h1's gateway, with no flush of its own; the VM then moves to h2 (both
// gateways get the new placement, the source first), and fio verifies
// every block through h2's gateway: the same volume on the shared
// datastore (nbdkit serving a directory), nothing copied, nothing lost.
func TestLiveVMMovesWithFio(t *testing.T) {
	needTools(t, "nbdkit", "fio")
	p := parsePolicy(t, siocPolicy)
	moved := parsePolicy(t, strings.Replace(siocPolicy, "{name: vm2, host: h1", "{name: vm2, host: h2", 1))
	uri := startNbdkit(t, Array{Dir: prepareDatastore(t, p), Threads: 16})
	dss := map[string]string{"ds1": uri}
	g1 := startGateway(t, p, "h1", dss, time.Second, "")
	g2 := startGateway(t, p, "h2", dss, time.Second, "")
	job := func(addr string, extra ...string) []fioJob {
		return []fioJob{{name: "vm2", uri: fmt.Sprintf("nbd://%s/vm2/disk0", addr), rw: "randwrite", bs: "4k", iodepth: 8,
			extra: append([]string{"size=16M", "verify=crc32c", "randrepeat=1"}, extra...)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := runFio(ctx, t, nil, job(g1.addr, "do_verify=0")); err != nil {
		t.Fatalf("fio writing through h1: %v", err)
	}
	if err := g1.g.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	if err := g2.g.SetPolicy(moved); err != nil {
		t.Fatal(err)
	}
	res, err := runFio(ctx, t, nil, job(g2.addr, "do_verify=1", "verify_only=1"))
	if err != nil {
		t.Fatalf("fio verifying through h2 (a verify error shows here): %v", err)
	}
	expectNoFioErrors(t, res)
	if got := strings.Join(g1.g.Exports(), " "); got != "vm1/disk0" {
		t.Errorf("h1 serves %q after the move, want vm1/disk0", got)
	}
}
