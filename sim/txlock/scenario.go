package txlock

import "fmt"

// Bulk is the bench's standing case: two backlogged VMs per sending CPU
// (at least 8), each sending skbs of segs segments; vm1 reserves 20% of
// the link, vm2 has twice the shares of the others, vm3 is limited to 5%,
// the rest share equally. The results cover [250 ms, duration): the VMs'
// queues fill first (2 MiB each, up to 175,000 MTU skbs in all).
func Bulk(form Form, linkBps float64, cpus, segs int, durationNs int64) Config {
	n := max(8, 2*cpus)
	vms := make([]VM, n)
	for i := range vms {
		vms[i] = VM{Name: fmt.Sprintf("vm%d", i+1), Shares: 50, Segs: segs}
	}
	vms[0].ReservationBps = 0.2 * linkBps
	vms[1].Shares = 100
	vms[2].LimitBps = 0.05 * linkBps
	return Config{
		Form: form, LinkBps: linkBps, CPUs: cpus, VMs: vms, Costs: CalibratedCosts,
		DurationNs: durationNs, WindowFromNs: 250_000_000, Seed: 1,
	}
}

// IdleBusy is the lending case: 8 backlogged VMs of 64 KiB skbs on 8 CPUs
// and queues, equal shares; vm1 sends nothing from 1.5 s to 2.2 s. The
// samples show who takes its rate while it idles (at once in the single
// tree; in mq-htb at once on its queue and at the agent's next intervals
// elsewhere; with EDT at the next intervals) and how soon it gets its rate
// back.
func IdleBusy(form Form, linkBps float64) Config {
	vms := make([]VM, 8)
	for i := range vms {
		vms[i] = VM{Name: fmt.Sprintf("vm%d", i+1), Shares: 50, Segs: 45}
	}
	vms[0].IdleFromNs, vms[0].IdleToNs = 1_500_000_000, 2_200_000_000
	return Config{
		Form: form, LinkBps: linkBps, CPUs: 8, Queues: 4, VMs: vms, Costs: CalibratedCosts,
		DurationNs: 3_000_000_000, WindowFromNs: 2_500_000_000, Seed: 1,
	}
}
