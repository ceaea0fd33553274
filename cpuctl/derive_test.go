package cpuctl

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/alloc"
	"sluice/policy"
)

// TestDerive runs testdata/derive.txt. Command:
//
//	derive cores=N mhz=MHZ [hostcores=N]
//
// Input: one VM a line, `NAME [v=VCPUS] [r=MHZ] [s=SHARES] [l=MHZ] [d=MHZ] [sensitive]`
// (defaults: 1 vCPU, shares normal × vCPUs, no reservation, no limit,
// unbounded demand; sensitive: latency-sensitive). The output is each
// VM's entitlement, reason, weight, shares and cpu.max (and the cores it
// is pinned to), the pinning's shared and host cores when something is
// pinned, then any broken invariant: under full contention a VM's weight
// fraction (and shares fraction) is at least its reservation fraction
// less one unit of rounding; a quota holds the limit; pinned cores are
// one per vCPU, distinct, none of the host's, none shared; the VMs not
// pinned are entitled to no more than the shared cores' MHz.
func TestDerive(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var h HostCPU
			d.ScanArgs(t, "cores", &h.Cores)
			d.ScanArgs(t, "mhz", &h.MHz)
			if d.HasArg("hostcores") {
				d.ScanArgs(t, "hostcores", &h.HostCores)
			}
			vms, err := parseVMs(d.Input)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			out := Derive(h, vms)
			var b strings.Builder
			for _, s := range out {
				fmt.Fprintf(&b, "%s %.0fMHz %s weight=%d shares=%d cpu.max=%q", s.VM, s.EntitlementMHz, s.ReasonString(), s.Weight, s.Shares, s.CPUMax())
				if s.Cores != nil {
					fmt.Fprintf(&b, " cores=%s", FormatCPUs(s.Cores))
				}
				b.WriteString("\n")
			}
			pin := Pin(h, vms)
			if pin.Pinned() {
				fmt.Fprintf(&b, "host cores %s, shared %s\n", FormatCPUs(pin.HostCores), FormatCPUs(pin.Shared))
			}
			if len(pin.Unpinned) > 0 {
				fmt.Fprintf(&b, "not pinned: %s\n", strings.Join(pin.Unpinned, " "))
			}
			for _, v := range checkPinning(h, vms, pin, out) {
				fmt.Fprintf(&b, "violation: %s\n", v)
			}
			for _, v := range checkSettings(h, vms, out) {
				fmt.Fprintf(&b, "violation: %s\n", v)
			}
			return b.String()
		})
	})
}

func parseVMs(in string) ([]VM, error) {
	var vms []VM
	for _, line := range strings.Split(strings.TrimSpace(in), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		v := VM{Name: f[0], VCPUs: 1, DemandMHz: alloc.Inf, Shares: -1}
		for _, kv := range f[1:] {
			if kv == "sensitive" {
				v.Sensitive = true
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("%q: want key=value", kv)
			}
			if k == "d" && val == "inf" {
				continue
			}
			n, err := strconv.Atoi(val)
			if err != nil {
				return nil, fmt.Errorf("%q: %v", kv, err)
			}
			switch k {
			case "v":
				v.VCPUs = n
			case "r":
				v.ReservationMHz = n
			case "s":
				v.Shares = n
			case "l":
				v.LimitMHz = n
			case "d":
				v.DemandMHz = float64(n)
			default:
				return nil, fmt.Errorf("%q: unknown key", kv)
			}
		}
		if v.Shares < 0 {
			v.Shares = policy.CPUSharesNormal * v.VCPUs
		}
		vms = append(vms, v)
	}
	return vms, nil
}

// checkPinning recomputes the invariants of a pinning.
func checkPinning(h HostCPU, vms []VM, pin Pinning, out []Setting) []string {
	var bad []string
	owner := map[int]string{}
	for _, c := range pin.HostCores {
		owner[c] = "the host"
	}
	var sharedMHz, unpinnedMHz float64
	for i, v := range vms {
		cores := pin.VMs[v.Name]
		if cores == nil {
			unpinnedMHz += out[i].EntitlementMHz
			continue
		}
		if !v.Sensitive || len(cores) != v.VCPUs {
			bad = append(bad, fmt.Sprintf("%s: pinned to %v with %d vCPUs (sensitive %v)", v.Name, cores, v.VCPUs, v.Sensitive))
		}
		for _, c := range cores {
			if o, ok := owner[c]; ok || c < 0 || c >= h.Cores {
				bad = append(bad, fmt.Sprintf("%s: core %d is %s's or out of range", v.Name, c, o))
			}
			owner[c] = v.Name
		}
	}
	for _, c := range pin.Shared {
		if o := owner[c]; o != "" && o != "the host" {
			bad = append(bad, fmt.Sprintf("shared core %d is pinned to %s", c, o))
		}
		sharedMHz += float64(h.MHz)
	}
	if pin.Pinned() && unpinnedMHz > sharedMHz+0.5 {
		bad = append(bad, fmt.Sprintf("the VMs not pinned are entitled to %.0fMHz, the shared cores have %.0fMHz", unpinnedMHz, sharedMHz))
	}
	return bad
}

// checkSettings recomputes the invariants of Derive's output.
func checkSettings(h HostCPU, vms []VM, out []Setting) []string {
	var bad []string
	capMHz := h.CapacityMHz()
	full := true
	var sumW, sumS float64
	for i, v := range vms {
		full = full && v.DemandMHz == alloc.Inf
		sumW += float64(out[i].Weight)
		sumS += float64(out[i].Shares)
	}
	for i, v := range vms {
		s := out[i]
		if s.Weight < MinWeight || s.Weight > MaxWeight || s.Shares < MinShares || s.Shares > MaxShares {
			bad = append(bad, fmt.Sprintf("%s: weight %d or shares %d out of range", v.Name, s.Weight, s.Shares))
		}
		if full && capMHz > 0 && v.ReservationMHz > 0 {
			want := float64(v.ReservationMHz) / capMHz
			if w := float64(s.Weight) / sumW; w < want-1/sumW {
				bad = append(bad, fmt.Sprintf("%s: weight fraction %.4f below reservation fraction %.4f", v.Name, w, want))
			}
			if w := float64(s.Shares) / sumS; w < want-1/sumS {
				bad = append(bad, fmt.Sprintf("%s: shares fraction %.4f below reservation fraction %.4f", v.Name, w, want))
			}
		}
		if v.LimitMHz > 0 && !v.Sensitive {
			held := float64(s.QuotaUs) / float64(s.PeriodUs) * float64(h.MHz)
			if s.QuotaUs < 0 || held < float64(v.LimitMHz) || held > float64(v.LimitMHz)+float64(h.MHz)*MinQuotaUs/float64(s.PeriodUs) {
				bad = append(bad, fmt.Sprintf("%s: quota %d/%d is not the limit %dMHz", v.Name, s.QuotaUs, s.PeriodUs, v.LimitMHz))
			}
		} else if s.QuotaUs != -1 {
			bad = append(bad, fmt.Sprintf("%s: quota %d without a limit", v.Name, s.QuotaUs))
		}
	}
	return bad
}
