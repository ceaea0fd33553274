package storage

import (
	"context"
	"math"
	"net"
	"testing"
	"time"

	"sluice/storage/nbd"
)

const twoHostPolicy = `
cluster: st2
hosts:
  - {name: h1, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
  - {name: h2, cpu: {cores: 4, mhz: 2000}, memory: 16GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - name: ds1
    sioc: {enabled: true, congestionThreshold: 12ms, controlPeriod: 1s, gamma: 0.5, shareTerm: 0.2, minWindow: 2, maxWindow: 100}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, shares: 1000, size: 1MiB}]}
  - {name: vm2, host: h2, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, shares: 1000, size: 1MiB}]}
`

// The control loop runs on the gateway's clock: a period ends when the
// fake clock passes it, reads h2's record from the stats volume, sets the
// window from the policy's gains and publishes h1's record stamped with
// the clock's time.
func TestControlLoopFakeClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := parsePolicy(t, twoHostPolicy)
	vols := newMemVolumes(p)
	ds := vols[StatsVolume]
	clk := newFakeClock(time.Unix(1000, 0))
	periods := make(chan Status, 1)
	g, addr := serveGateway(t, p, vols.serve(t, nil), Options{Clock: clk, OnPeriod: func(s Status) { periods <- s }})
	clk.waitTickers(1)
	// h2, second in the policy, writes into the first slot: slots are
	// found by host name, not by position in the policy.
	h2Off := uint64(statsHeaderBytes)
	ctl := pardaController(p.Datastores[0].SIOC)

	// h1 reads through the gateway: with the clock standing still its I/Os
	// count, at latency 0.
	c, err := nbd.Dial(ctx, "tcp", addr, "vm1/disk0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if err := c.ReadAt(make([]byte, 4096), 0); err != nil {
			t.Fatal(err)
		}
	}

	window := initialWindow(ctl)
	for period := 1; period <= 2; period++ {
		end := clk.Now().Add(time.Second)
		// h2 reports 1000 I/Os at 24 ms with window 40 and 1000 shares.
		h2 := rec("h2", end.UnixNano(), 1000, 24*ms, 40, 1000)
		_ = ds.WriteAt(encodeStatsRecord(h2), h2Off, false)
		clk.Advance(time.Second)
		var st Status
		select {
		case st = <-periods:
		case <-ctx.Done():
			t.Fatalf("period %d did not end", period)
		}
		h1IOs, h1Shares := uint64(0), 0.0
		if period == 1 {
			h1IOs, h1Shares = 3, 1000
		}
		// The datastore: (h1's I/Os at 0 + 1000 at 24 ms) / all.
		lat := 1000 * 24 * ms / float64(1000+h1IOs)
		totalWindow := 40.0
		if h1Shares > 0 {
			totalWindow += window
		}
		want := ctl.UpdateScaled(window, lat, h1Shares, 1000+h1Shares, totalWindow)
		if want == window {
			t.Fatalf("period %d: the window would not move (%v); the test shows nothing", period, want)
		}
		d := st.Datastores[0]
		if st.TimeUnixNs != end.UnixNano() || st.PeriodS != 1 || d.HostsSeen != 2 || math.Abs(d.Window-want) > 1e-9 {
			t.Errorf("period %d: status time %d period %vs hosts %d window %v; want %d, 1s, 2, %v", period, st.TimeUnixNs, st.PeriodS, d.HostsSeen, d.Window, end.UnixNano(), want)
		}
		// The totals count since the disk was opened: period 2 still
		// shows period 1's reads.
		var reads, writes uint64 = 1 << 63, 1 << 63
		for _, dk := range st.Disks {
			if dk.Disk == "vm1/disk0" {
				reads, writes = dk.ReadsTotal, dk.WritesTotal
			}
		}
		if reads != 3 || writes != 0 {
			t.Errorf("period %d: vm1/disk0 totals %d reads, %d writes; want 3, 0", period, reads, writes)
		}
		got, ok := vols.slotOf("h1")
		if !ok || got.PeriodEndNs != end.UnixNano() || got.PeriodNs != 1e9 || got.IOs != h1IOs || got.Window != window {
			t.Errorf("period %d: h1's record %+v (ok %v), want end %d, 1 s, %d I/Os, window %v", period, got, ok, end.UnixNano(), h1IOs, window)
		}
		window = want
	}
	if g.Status().Datastores[0].Window != window {
		t.Errorf("Status() window %v, want %v", g.Status().Datastores[0].Window, window)
	}
}

// While the datastore does not answer, the control loop goes on: every
// period ends on time, with the disks' counters, instead of waiting for
// the stats volume for the disks' retry window.
func TestControlLoopDatastoreDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := parsePolicy(t, twoHostPolicy)
	vols := newMemVolumes(p)
	ex := nbd.MapExports{}
	for n, v := range vols {
		ex[n] = v
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &nbd.Server{Exports: ex}
	go srv.Serve(l)
	clk := newFakeClock(time.Unix(1000, 0))
	periods := make(chan Status, 1)
	serveGateway(t, p, l.Addr().String(), Options{Clock: clk, OnPeriod: func(s Status) { periods <- s }})
	clk.waitTickers(1)
	srv.Close() // the datastore goes away
	for period := 1; period <= 3; period++ {
		clk.Advance(time.Second)
		select {
		case st := <-periods:
			if want := clk.Now().UnixNano(); st.TimeUnixNs != want {
				t.Errorf("period %d: status of %d, want %d", period, st.TimeUnixNs, want)
			}
		case <-ctx.Done():
			clk.Advance(time.Minute) // past any retry, so that the gateway can close
			t.Fatalf("period %d did not end while the datastore was down: the control loop waits for the stats volume", period)
		}
	}
}
