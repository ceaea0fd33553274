//go:build qemubench

package virtstorage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/virt"
)

// TestQEMUOverhead is the gateway's overhead with QEMU as the client
// (bench/storage-qemu-overhead.sh runs it; not part of `make test`): one
// TCG guest of a lab, fio inside it (4 KiB random reads, direct I/O,
// libaio) at queue depths 1 and 32 on two disks, alternating, ROUNDS
// times:
//
//   - gateway: the guest's disk from the lab, QEMU → Unix socket → sluice
//     gateway → TCP (veth) → the lab's datastore (nbdkit);
//   - direct: a second nbdkit with the same arguments as the lab's
//     datastore, on 127.0.0.1 (TCP loopback), hot-plugged into the guest
//     as a second virtio disk: QEMU → TCP → nbdkit.
//
// The first 64 MiB of both disks are written first, so that reads hit allocated memory. It
// prints a table of medians. Settings from the environment: SECONDS per run
// (default 10), ROUNDS (3), SERVICE_TIME (e.g. 1ms: an array of 64 slots of
// that service time; default the policy's default array, 8 slots × 5 ms,
// 1600 IOPS).
func TestQEMUOverhead(t *testing.T) {
	secs := envInt(t, "SECONDS", 10)
	rounds := envInt(t, "ROUNDS", 3)
	array := ""
	if st := os.Getenv("SERVICE_TIME"); st != "" {
		if _, err := time.ParseDuration(st); err != nil {
			t.Fatalf("SERVICE_TIME=%q: %v", st, err)
		}
		array = fmt.Sprintf("\n    array: {slots: 64, serviceTime: %s}", st)
	}
	guestTTL = time.Duration(rounds*4*(secs+30)+300) * time.Second
	l := upLab(t, "vsb", `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}`+array+`
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, disks: [{name: d0, datastore: ds1, size: 64MiB}]}
`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds*4*(secs+30)+300)*time.Second)
	defer cancel()

	// The direct disk: a twin of the lab's datastore in this namespace.
	ds := l.Plan.Datastores[0]
	port := 10990
	pidFile := filepath.Join(l.Dir, "direct-nbdkit.pid")
	args := append([]string{"--pidfile", pidFile, "-i", "127.0.0.1", "-p", strconv.Itoa(port)}, ds.Array.NbdkitArgs()...)
	if out, err := exec.Command("nbdkit", args...).CombinedOutput(); err != nil {
		t.Fatalf("nbdkit %s: %v: %s", strings.Join(args, " "), err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	})
	direct := virt.NBDDisk{Host: "127.0.0.1", Port: port, Serial: "direct"}
	l.hotplug(t, "vm1", direct, 0x1f)
	waitGuestFile(ctx, t, l, "vm1", "/sys/block/vdb")
	r, err := lab.GuestExec(ctx, l.P.Cluster, "vm1", "/bin/sh", "-c", "cat /sys/block/vda/serial; echo; cat /sys/block/vdb/serial")
	if got := strings.Fields(string(r.Stdout)); err != nil || len(got) != 2 || got[0] != "d0" || got[1] != "direct" {
		t.Fatalf("serials of vda, vdb = %q (%v), want d0, direct", r.Stdout, err)
	}
	for _, dev := range []string{"/dev/vda", "/dev/vdb"} {
		if f := l.GuestFio(ctx, "vm1", "name=fill", "filename="+dev, "direct=1", "ioengine=libaio", "iodepth=8", "rw=write", "bs=1M", "size=64M"); f.Err != nil {
			t.Fatalf("fill %s: %v %s", dev, f.Err, tail(f.Stderr, 5))
		}
	}

	type key struct {
		path string
		qd   int
	}
	iops, p50 := map[key][]float64{}, map[key][]float64{}
	for round := 0; round < rounds; round++ {
		for _, qd := range []int{1, 32} {
			for _, path := range []string{"gateway", "direct"} {
				dev := map[string]string{"gateway": "/dev/vda", "direct": "/dev/vdb"}[path]
				f := l.GuestFio(ctx, "vm1", "name=r", "filename="+dev, "direct=1", "ioengine=libaio", "iodepth="+strconv.Itoa(qd),
					"rw=randread", "bs=4k", "size=64M", "time_based", "ramp_time=2", "runtime="+strconv.Itoa(secs))
				if f.Err != nil || f.JobError != 0 {
					t.Fatalf("fio %s qd %d: %v %s", path, qd, f.Err, tail(f.Stderr, 5))
				}
				k := key{path, qd}
				iops[k] = append(iops[k], f.ReadIOPS)
				p50[k] = append(p50[k], f.ReadP50Us)
				t.Logf("round %d: %-7s qd %2d: %6.0f IOPS, p50 %6.0f µs, guest CPU usr %.0f%% sys %.0f%%; load %s",
					round+1, path, qd, f.ReadIOPS, f.ReadP50Us, f.UsrCPU, f.SysCPU, loadavg())
			}
		}
	}
	svc := "64 slots × " + os.Getenv("SERVICE_TIME")
	if os.Getenv("SERVICE_TIME") == "" {
		svc = "the default array (8 slots × 5 ms, 1600 IOPS)"
	}
	fmt.Printf("\nfio in a TCG guest (1 vCPU), 4 KiB random reads, %d s × %d rounds (medians), datastore %s\n", secs, rounds, svc)
	fmt.Printf("%-4s %12s %12s %8s %14s %14s %10s\n", "QD", "direct IOPS", "gateway IOPS", "ratio", "direct p50 µs", "gateway p50 µs", "added µs")
	for _, qd := range []int{1, 32} {
		di, gi := med(iops[key{"direct", qd}]), med(iops[key{"gateway", qd}])
		dp, gp := med(p50[key{"direct", qd}]), med(p50[key{"gateway", qd}])
		fmt.Printf("%-4d %12.0f %12.0f %7.0f%% %14.0f %14.0f %+10.0f\n", qd, di, gi, 100*gi/di, dp, gp, gp-dp)
	}
}

// hotplug attaches d to the running guest vm through QEMU's monitor (the
// disk is not in libvirt's domain definition).
func (l *guestLab) hotplug(t *testing.T, vm string, d virt.NBDDisk, slot int) {
	t.Helper()
	c, err := virt.Dial("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dom, err := c.Client().DomainLookupByName(lab.NamespacePrefix(l.P.Cluster) + vm)
	if err != nil {
		t.Fatal(err)
	}
	a := d.QemuArgs(slot) // -blockdev JSON, -device string
	dev := map[string]string{"driver": "virtio-blk-pci"}
	for _, kv := range strings.Split(a[3], ",")[1:] {
		k, v, _ := strings.Cut(kv, "=")
		dev[k] = v
	}
	for _, cmd := range []string{
		`{"execute":"blockdev-add","arguments":` + a[1] + `}`,
		`{"execute":"device_add","arguments":` + jsonObject(dev) + `}`,
	} {
		out, err := c.Client().QEMUDomainMonitorCommand(dom, cmd, 0)
		if err != nil || strings.Contains(out, `"error"`) {
			t.Fatalf("QMP %s: %v %s", cmd, err, out)
		}
	}
}

func jsonObject(m map[string]string) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, strconv.Quote(k)+":"+strconv.Quote(m[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// waitGuestFile polls until path exists in the guest.
func waitGuestFile(ctx context.Context, t *testing.T, l *guestLab, vm, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := lab.GuestExec(ctx, l.P.Cluster, vm, "/bin/sh", "-c", "test -e "+path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not appear within 30 s", vm, path)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func envInt(t *testing.T, name string, def int) int { return livelab.EnvInt(t, name, def) }

func med(v []float64) float64 { return median(v) }
