//go:build qemubench

package throttlelive

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/agent"
	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/throttle"
	"sluice/throttle/dirstats"
	"sluice/virt"
)

// TestThrottleOverhead is the throttle driver's overhead beside no sluice
// and the gateway (bench/throttle-overhead.sh runs it; not part of `make
// test`): one TCG guest with two disks, each on its own datastore of the
// same emulated array (64 slots × SERVICE_TIME, default 1ms):
//
//   - t, on a datastore with the throttle driver: the qcow2 image from
//     nbdkit's Unix socket, measured with no sluice (none: no throttle,
//     the drivers stopped and uninstalled), with QEMU's throttle alone
//     (static: the same throttle set once, no driver running) and with
//     the throttle driver running (throttle: agent.Throttler every
//     second; the disk's limit of 100000 IOPS is a throttle QEMU applies
//     to every request, well above what it does);
//   - g, on a datastore with the gateway: QEMU → the VM's socket →
//     sluice gateway → nbdkit.
//
// fio inside (4 KiB random reads, direct I/O, libaio) at queue depths 1
// and 32, SECONDS per run (default 10), the four alternating, ROUNDS
// times (default 1); it prints the medians.
func TestThrottleOverhead(t *testing.T) {
	secs := livelab.EnvInt(t, "SECONDS", 10)
	rounds := livelab.EnvInt(t, "ROUNDS", 1)
	st := os.Getenv("SERVICE_TIME")
	if st == "" {
		st = "1ms"
	}
	if _, err := time.ParseDuration(st); err != nil {
		t.Fatalf("SERVICE_TIME=%q: %v", st, err)
	}
	ttl := time.Duration(rounds*6*(secs+20)+300) * time.Second
	l := livelab.UpGuestLab(t, "tb", `cluster: %s
hosts:
  - name: h1
    uplinks: [{name: up0, speed: 1Gbps}]
datastores:
  - name: dst
    driver: throttle
    array: {slots: 64, serviceTime: `+st+`}
  - name: dsg
    sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}
    array: {slots: 64, serviceTime: `+st+`}
vms:
  - {name: vm1, host: h1, lab: {kind: qemu}, disks: [{name: t, datastore: dst, size: 64MiB, limitIOPS: 100000}, {name: g, datastore: dsg, size: 64MiB}]}
`, lab.Options{Gateway: sluiceBin, GuestTTL: ttl}, "qemu-img")
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	// The guest's devices by serial (the gateway's disk may be a QEMU
	// argument, created before libvirt's).
	dev := map[string]string{}
	r, err := lab.GuestExec(ctx, l.P.Cluster, "vm1", "/bin/sh", "-c", "for d in /sys/block/vd*; do echo ${d##*/} $(cat $d/serial); done")
	for _, line := range strings.Split(strings.TrimSpace(string(r.Stdout)), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			dev[f[1]] = "/dev/" + f[0]
		}
	}
	if err != nil || dev["t"] == "" || dev["g"] == "" {
		t.Fatalf("guest disks by serial: %q (%v)", r.Stdout, err)
	}

	c, err := virt.Dial("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pr := &agent.NBDProber{Network: "unix", Addr: lab.NbdkitSocket(l.Dir, l.P.Cluster, "dst"), Export: dirstats.ProbeName}
	defer pr.Close()
	th, err := agent.NewThrottler(l.P, "h1", c, []agent.ThrottleDatastore{{Name: "dst", Dir: lab.VolumeDir(l.Dir, l.P.Cluster, "dst"), Probe: pr}}, l.Dir)
	if err != nil {
		t.Fatal(err)
	}
	th.Domain = func(vm string) string { return lab.NamespacePrefix(l.P.Cluster) + vm }
	domain := th.Domain("vm1")
	// per-disk: the same driver reading the counters as before 4e50f67,
	// two virDomainBlockStatsFlags calls per disk (A/B in one run).
	thOld, err := agent.NewThrottler(l.P, "h1", perDiskStats{c}, []agent.ThrottleDatastore{{Name: "dst", Dir: lab.VolumeDir(l.Dir, l.P.Cluster, "dst"), Probe: pr}}, l.Dir)
	if err != nil {
		t.Fatal(err)
	}
	thOld.Domain = th.Domain
	var stop func()
	start := func(th *agent.Throttler) {
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); th.Run(runCtx, nil, time.Second, func(agent.ThrottleStatus, error) {}) }()
		stop = func() {
			cancel()
			wg.Wait()
			if err := th.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}
		// Poll until QEMU applies the disk's throttle.
		for deadline := time.Now().Add(10 * time.Second); ; {
			if got, err := c.IOTune(domain, "vda"); err == nil && got.IOPS == 100000 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the throttle driver set no throttle on disk t within 10 s")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()

	type key struct {
		cfg string
		qd  int
	}
	iops, p50, p99 := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	cfgs := []string{"none", "static", "throttle", "gateway"}
	if os.Getenv("PERDISK") != "" {
		cfgs = []string{"none", "static", "throttle", "per-disk", "gateway"}
	}
	for round := 0; round < rounds; round++ {
		for _, cfg := range cfgs {
			switch cfg {
			case "none":
				if stop != nil {
					stop()
					stop = nil
				}
				if got, err := c.IOTune(domain, "vda"); err != nil || got.IOPS != 0 {
					t.Fatalf("no sluice: disk t has %+v (%v), want no throttle", got, err)
				}
			case "static":
				// QEMU's throttle alone: the driver's throttle set once,
				// no driver running (no block stats read, no probes).
				if err := c.SetIOTune(domain, "vda", throttle.LimitsFor(100000)); err != nil {
					t.Fatal(err)
				}
			case "throttle", "per-disk":
				if stop != nil {
					stop()
					stop = nil
				}
				if err := c.SetIOTune(domain, "vda", throttle.Limits{}); err != nil {
					t.Fatal(err)
				}
				if cfg == "throttle" {
					start(th)
				} else {
					start(thOld)
				}
			}
			d := dev["t"]
			if cfg == "gateway" {
				d = dev["g"]
			}
			for _, qd := range []int{1, 32} {
				f := l.GuestFio(ctx, "vm1", "name=r", "filename="+d, "direct=1", "ioengine=libaio", "iodepth="+strconv.Itoa(qd),
					"rw=randread", "bs=4k", "size=64M", "time_based", "ramp_time=2", "runtime="+strconv.Itoa(secs))
				if f.Err != nil || f.JobError != 0 {
					t.Fatalf("fio %s qd %d: %v %s", cfg, qd, f.Err, livelab.Tail(f.Stderr, 5))
				}
				k := key{cfg, qd}
				iops[k], p50[k], p99[k] = append(iops[k], f.ReadIOPS), append(p50[k], f.ReadP50Us), append(p99[k], f.ReadP99Us)
				t.Logf("round %d: %-8s qd %2d: %6.0f IOPS, p50 %6.0f µs, p99 %6.0f µs, guest CPU usr %.0f%% sys %.0f%%; load %s",
					round+1, cfg, qd, f.ReadIOPS, f.ReadP50Us, f.ReadP99Us, f.UsrCPU, f.SysCPU, livelab.Loadavg())
			}
		}
	}
	fmt.Printf("\nfio in a TCG guest (1 vCPU), 4 KiB random reads, %d s × %d rounds (medians), array 64 slots × %s\n", secs, rounds, st)
	fmt.Printf("%-4s %-9s %10s %10s %10s %12s %12s\n", "QD", "driver", "IOPS", "p50 µs", "p99 µs", "p50 vs none", "p99 vs none")
	for _, qd := range []int{1, 32} {
		n50, n99 := livelab.Median(p50[key{"none", qd}]), livelab.Median(p99[key{"none", qd}])
		for _, cfg := range cfgs {
			k := key{cfg, qd}
			fmt.Printf("%-4d %-9s %10.0f %10.0f %10.0f %+11.1f%% %+11.1f%%\n", qd, cfg, livelab.Median(iops[k]), livelab.Median(p50[k]), livelab.Median(p99[k]),
				100*(livelab.Median(p50[k])-n50)/n50, 100*(livelab.Median(p99[k])-n99)/n99)
		}
	}
}

// perDiskStats reads block counters as the driver did before 4e50f67:
// per disk, one virDomainBlockStatsFlags call for the number of fields
// and one for them, each a query-blockstats on QEMU's monitor.
type perDiskStats struct{ *virt.Libvirt }

func (p perDiskStats) BlockStats(vms []string) ([]throttle.HostDisk, error) {
	var out []throttle.HostDisk
	for _, name := range vms {
		x, err := p.LiveXML(name)
		if err != nil {
			return nil, err
		}
		dom, err := virt.ParseDomainXML(x)
		if err != nil {
			return nil, err
		}
		d, err := p.Client().DomainLookupByName(name)
		if err != nil {
			return nil, err
		}
		for _, k := range dom.Disks {
			_, n, err := p.Client().DomainBlockStatsFlags(d, k.Target, 0, 0)
			if err != nil {
				return nil, err
			}
			ps, _, err := p.Client().DomainBlockStatsFlags(d, k.Target, n, 0)
			if err != nil {
				return nil, err
			}
			var c throttle.Counters
			for _, f := range ps {
				v, ok := f.Value.I.(int64)
				if !ok || v < 0 {
					continue
				}
				switch f.Field {
				case "rd_operations", "wr_operations", "flush_operations":
					c.Ops += uint64(v)
				case "rd_bytes", "wr_bytes":
					c.Bytes += uint64(v)
				case "rd_total_times", "wr_total_times", "flush_total_times":
					c.TimeNs += uint64(v)
				}
			}
			out = append(out, throttle.HostDisk{VM: name, Target: k.Target, Serial: k.Serial, Counters: c})
		}
	}
	return out, nil
}
