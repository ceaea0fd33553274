// Command txlockbench prints the table of bench/htb-lock.sh: sim/txlock's
// model for each form, link rate, number of sending CPUs and skb size.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"sluice/sim/txlock"
)

func main() {
	secs := flag.Float64("seconds", 0.5, "simulated seconds per cell (the first 0.25 s is not counted)")
	links := flag.String("links", "10,25,40,100", "link rates, Gbit/s")
	cpus := flag.String("cpus", "4,8,16,32,64", "sending CPUs")
	flag.Parse()
	dur := int64(*secs * 1e9)
	c := txlock.CalibratedCosts
	fmt.Printf("# sim/txlock, costs per skb: stack %.0f ns + %.0f/segment, HTB %.0f ns in the lock, fq %.0f (assumed), program %.0f (assumed), handoff %.0f\n",
		c.StackNs, c.StackSegNs, c.HTBNs, c.FQNs, c.ProgNs, c.HandoffNs)
	fmt.Printf("# single lock bound: %.2f Mpps = %.1f Gbit/s of MTU skbs, %.0f Gbit/s of 64 KiB skbs\n",
		txlock.LockBoundPps(c.HTBNs)/1e6, txlock.LockBoundPps(c.HTBNs)*txlock.WireBits(1)/1e9, txlock.LockBoundPps(c.HTBNs)*txlock.WireBits(45)/1e9)
	fmt.Println("# err: worst |rate − entitlement| / entitlement over VMs due ≥ 1% of the link; split: the same against alloc on the achieved rate")
	fmt.Printf("%-10s %5s %4s %4s %8s %6s %7s %7s %6s %6s %9s %5s\n",
		"form", "skb", "Gbps", "CPUs", "got", "Mpps", "err", "split", "cores", "spin", "cores/Gb", "lock")
	for _, segs := range []int{1, 45} {
		for _, l := range parse(*links) {
			for _, n := range parse(*cpus) {
				for _, f := range txlock.Forms {
					r := txlock.Run(txlock.Bulk(f, float64(l)*1e9, n, segs, dur))
					size := "1500"
					if segs > 1 {
						size = "64K"
					}
					fmt.Printf("%-10s %5s %4d %4d %8.2f %6.2f %6.1f%% %6.1f%% %6.2f %6.2f %9.3f %4.0f%%\n",
						f, size, l, n, r.Gbps(), r.Pps/1e6, 100*r.MaxError(false), 100*r.MaxError(true),
						r.CPUCores, r.SpinCores, r.CPUPerGbps(), 100*r.LockBusy)
				}
			}
		}
	}
	fmt.Println("# idle/busy: vm1 of 8 (equal shares, 64 KiB skbs, 8 CPUs, 4 queues, 25 Gbit/s) idles 1.5–2.2 s;")
	fmt.Println("# link Gbit/s per 100-ms interval from 1.4 s, and vm1's")
	for _, f := range txlock.Forms {
		r := txlock.Run(txlock.IdleBusy(f, 25e9))
		var link, vm1 []string
		for _, s := range r.Samples {
			if s.AtNs > 1_400_000_000 && s.AtNs <= 2_800_000_000 {
				link = append(link, fmt.Sprintf("%.1f", s.RateBps/1e9))
				vm1 = append(vm1, fmt.Sprintf("%.1f", s.VMRateBps[0]/1e9))
			}
		}
		fmt.Printf("%-10s link %s\n%-10s vm1  %s\n", f, strings.Join(link, " "), "", strings.Join(vm1, " "))
	}
}

func parse(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var v int
		if _, err := fmt.Sscan(f, &v); err != nil {
			fmt.Fprintf(os.Stderr, "txlockbench: bad number %q\n", f)
			os.Exit(2)
		}
		out = append(out, v)
	}
	return out
}
