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
//	derive cores=N mhz=MHZ
//
// Input: one VM a line, `NAME [v=VCPUS] [r=MHZ] [s=SHARES] [l=MHZ] [d=MHZ]`
// (defaults: 1 vCPU, shares normal × vCPUs, no reservation, no limit,
// unbounded demand). The output is each VM's entitlement, reason, weight,
// shares and cpu.max, then any broken invariant: under full contention a
// VM's weight fraction (and shares fraction) is at least its reservation
// fraction less one unit of rounding; a quota holds the limit.
func TestDerive(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var h HostCPU
			d.ScanArgs(t, "cores", &h.Cores)
			d.ScanArgs(t, "mhz", &h.MHz)
			vms, err := parseVMs(d.Input)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			out := Derive(h, vms)
			var b strings.Builder
			for _, s := range out {
				fmt.Fprintf(&b, "%s %.0fMHz %s weight=%d shares=%d cpu.max=%q\n", s.VM, s.EntitlementMHz, s.Reason, s.Weight, s.Shares, s.CPUMax())
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
		if v.LimitMHz > 0 {
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
