package txlock

import (
	"fmt"
	"math"
	"reflect"
	"testing"
)

// At low load (the VMs offer half the link between them, in MTU skbs, and
// the CPUs have room) every form gives every VM what it offers, which is
// its entitlement.
func TestLowLoadMeetsEntitlements(t *testing.T) {
	for _, f := range Forms {
		t.Run(f.String(), func(t *testing.T) {
			cfg := Bulk(f, 10e9, 8, 1, 1_000_000_000)
			for i := range cfg.VMs {
				cfg.VMs[i].DemandBps = 0.5 * cfg.LinkBps / float64(len(cfg.VMs))
			}
			cfg.VMs[2].DemandBps = 0.04 * cfg.LinkBps // below its 5% limit
			r := Run(cfg)
			for _, v := range r.VMs {
				if math.Abs(v.RateBps-v.EntitledBps) > 0.03*v.EntitledBps { // Poisson offers: ±0.6% a σ
					t.Errorf("%s: %.3f Gbit/s, entitled %.3f", v.Name, v.RateBps/1e9, v.EntitledBps/1e9)
				}
			}
			if r.SpinCores > 0.05 {
				t.Errorf("spinning %.3f cores at low load", r.SpinCores)
			}
		})
	}
}

// The link is the bottleneck with 64 KiB skbs: every form fills it and
// splits it as alloc says.
func TestLinkBoundSplit(t *testing.T) {
	for _, f := range Forms {
		r := Run(Bulk(f, 25e9, 8, 45, 450_000_000))
		if r.RateBps < 0.99*r.Config.LinkBps {
			t.Errorf("%s: %.2f Gbit/s of %.0f", f, r.Gbps(), r.Config.LinkBps/1e9)
		}
		if e := r.MaxError(false); e > 0.02 {
			t.Errorf("%s: worst VM %.1f%% off its entitlement", f, 100*e)
		}
	}
}

// One lock passes at most 1/(its hold per skb) skbs per second, whatever
// the number of CPUs and the link; with enough CPUs the single tree reaches
// that bound and no more, and the CPUs it does not use spin.
func TestSingleLockBound(t *testing.T) {
	c := CalibratedCosts
	for _, cpus := range []int{8, 32} {
		r := Run(Bulk(FormSingleHTB, 100e9, cpus, 1, 400_000_000))
		bound := LockBoundPps(c.HTBNs)
		if r.Pps > bound*1.0001 {
			t.Errorf("%d CPUs: %.3f Mpps above the lock's bound %.3f", cpus, r.Pps/1e6, bound/1e6)
		}
		// Every handoff lengthens the hold: with many CPUs nearly every skb
		// pays it.
		if withHandoff := LockBoundPps(c.HTBNs + c.HandoffNs); r.Pps < 0.97*withHandoff {
			t.Errorf("%d CPUs: %.3f Mpps, below 97%% of %.3f", cpus, r.Pps/1e6, withHandoff/1e6)
		}
		if r.LockBusy < 0.99 {
			t.Errorf("%d CPUs: lock busy %.2f", cpus, r.LockBusy)
		}
		if r.SpinCores < 0.2*float64(cpus) {
			t.Errorf("%d CPUs: only %.2f cores spinning", cpus, r.SpinCores)
		}
	}
	// The bound holds for any hold time.
	for _, hold := range []float64{200, 1000, 3000} {
		cfg := Bulk(FormSingleHTB, 100e9, 16, 1, 100_000_000)
		cfg.WindowFromNs = 20_000_000
		cfg.Costs.HTBNs, cfg.Costs.HandoffNs = hold, 0
		if r := Run(cfg); r.Pps > LockBoundPps(hold)*1.0001 {
			t.Errorf("hold %.0f ns: %.3f Mpps above %.3f", hold, r.Pps/1e6, LockBoundPps(hold)/1e6)
		}
	}
}

// The same config gives the same result; another seed changes the jitter.
func TestDeterminism(t *testing.T) {
	for _, f := range Forms {
		a := Run(Bulk(f, 40e9, 16, 1, 300_000_000))
		b := Run(Bulk(f, 40e9, 16, 1, 300_000_000))
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs of one config differ", f)
		}
		cfg := Bulk(f, 40e9, 16, 1, 300_000_000)
		cfg.Seed = 2
		if c := Run(cfg); fmt.Sprint(c.VMs) == fmt.Sprint(a.VMs) && c.CPUCores == a.CPUCores {
			t.Errorf("%s: seed 2 gives seed 1's result", f)
		}
	}
}

// A VM that goes idle: in the single tree and in per-queue HTB the others
// take its rate at once (HTB lends per skb; here each queue holds two
// VMs); with EDT its rate stays unused until the agent moves it, which
// takes the agent's second of saturation memory (agent/demand.go).
func TestIdleLending(t *testing.T) {
	for _, f := range Forms {
		r := Run(IdleBusy(f, 25e9))
		var during, after float64
		for _, s := range r.Samples {
			if s.AtNs > 1_600_000_000 && s.AtNs <= 2_200_000_000 {
				during = math.Max(during, s.RateBps)
			}
			if s.AtNs > 2_300_000_000 {
				after = s.VMRateBps[0]
			}
		}
		switch f {
		case FormEDTFQ:
			if during > 0.9*25e9 {
				t.Errorf("%s: link at %.1f Gbit/s while vm1 idles; EDT should leave its 1/8 unused", f, during/1e9)
			}
		default:
			if during < 0.99*25e9 {
				t.Errorf("%s: link at %.1f Gbit/s while vm1 idles", f, during/1e9)
			}
		}
		if want := 25e9 / 8; math.Abs(after-want) > 0.05*want {
			t.Errorf("%s: vm1 back at %.2f Gbit/s, entitled %.2f", f, after/1e9, want/1e9)
		}
	}
}

// Queues: the agent's assignment for per-queue HTB puts the largest
// reservation first on its own queue and balances the rest.
func TestAssignQueues(t *testing.T) {
	cfg := Bulk(FormPerQueueHTB, 10e9, 4, 1, 1)
	cfg.Queues = 4
	got := fmt.Sprint(assignQueues(withDefaults(cfg)))
	if want := "[0 1 2 3 1 2 3 1]"; got != want {
		t.Errorf("queues %s, want %s", got, want)
	}
}
