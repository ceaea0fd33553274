package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"sluice/agent"
	"sluice/entitle"
	"sluice/explain"
	"sluice/lab"
	"sluice/parda"
	"sluice/policy"
)

func init() {
	register(command{
		name:    "explain",
		summary: "why a port (VM/NIC, HOST/CLASS) or disk (VM/DISK) gets what it gets, level by level",
		run:     runExplain,
	})
}

const explainUsage = "usage: sluice explain FILE PORT [--demand PORT=RATE ...] [--unnamed HOST/VM/NIC ...] [--cpu-mhz-per-gbps MHZ]"

func runExplain(args []string, stdout, stderr io.Writer) int {
	args, mhzPerGbps, err := cutCPUCostFlag(args)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v; %s\n", err, explainUsage)
		return exitUsage
	}
	a, code, ok := parseOrExit("explain", args, explainUsage, stdout, stderr)
	if !ok {
		return code
	}
	if len(a.rest) != 1 {
		fmt.Fprintf(stderr, "sluice: explain wants one PORT; %s\n", explainUsage)
		return exitUsage
	}
	port := a.rest[0]
	p, code := loadPolicy(a.file, stderr)
	if p == nil {
		return code
	}
	live := entitle.Live{Unnamed: a.unnamed}
	lines, err := explain.Lines(p, live, port, explain.Options{
		DemandBps: a.demands, CPUMHzPerGbps: mhzPerGbps, CPUCostSource: "--cpu-mhz-per-gbps",
		HostLocal: func(host, disk string) []string { return throttleLines(p, host, disk, lab.DefaultStateDir) },
	})
	if errors.Is(err, explain.ErrNoSuchPort) {
		hint := ""
		if vm, _, ok := strings.Cut(port, "/"); ok && p.VM(vm) == nil && p.Host(vm) == nil {
			hint = fmt.Sprintf("; %s is no VM of the policy: for one that runs unnamed give --unnamed HOST/%s", vm, port)
		}
		fmt.Fprintf(stderr, "sluice: %s: no such port or disk (ports are VM/NIC of a placed VM or HOST/CLASS; disks VM/DISK)%s\n", port, hint)
		return exitBad
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	// A port's uplink NICs, as their host's agent read them (host-local).
	lines = append(lines, nicLines(p, live, port, lab.DefaultStateDir)...)
	lines = append(lines, vfLiveLines(p, live, port, lab.DefaultStateDir)...)
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return exitOK
}

// cutCPUCostFlag takes --cpu-mhz-per-gbps MHZ (or =MHZ) out of args: the
// cost of sending per Gbps that replaces the hosts' (explain.Options), 0
// when not given.
func cutCPUCostFlag(args []string) ([]string, float64, error) {
	var c float64
	var rest []string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		if name != "--cpu-mhz-per-gbps" && name != "-cpu-mhz-per-gbps" {
			rest = append(rest, args[i])
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, c, fmt.Errorf("flag %s needs a value", name)
			}
			i++
			val = args[i]
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, c, fmt.Errorf("%s %s: want MHz per Gbps, a number above 0", name, val)
		}
		c = v
	}
	return rest, c, nil
}

// measuredLine says what the throttle driver measured of the datastore's
// capacity.
func measuredLine(ds agent.ThrottleDatastoreStatus) string {
	return fmt.Sprintf("datastore %s capacity measured (periods at or above %.0f ms): %s", ds.Name, ds.ThresholdMs, measuredText(ds.MeasuredIOPS, ds.CapacityPeriods))
}

// measuredText is a datastore's measured capacity as the status commands
// and explain show it: iops over periods congested periods (parda.Capacity;
// iops 0: not measured yet).
func measuredText(iops float64, periods int) string {
	if iops > 0 {
		return fmt.Sprintf("%.0f IOPS (median of %d congested periods)", iops, periods)
	}
	return fmt.Sprintf("not yet (%d of %d congested periods)", periods, parda.MinCapacityPeriods)
}

// throttleLines explains what the throttle driver of host did to disk
// name in its last period, from its status file in stateDir; nothing when
// the file is not there. These are explain.Options.HostLocal's lines: only
// the host the file is on can say them.
func throttleLines(p *policy.Policy, host, name, stateDir string) []string {
	path := agent.ThrottleStatusPath(stateDir, p.Cluster, host)
	st, err := agent.ReadThrottleStatus(path)
	if err != nil {
		return nil
	}
	ago := time.Since(time.Unix(0, st.TimeUnixNs)).Round(100 * time.Millisecond)
	for _, d := range st.Disks {
		if d.Disk != name {
			continue
		}
		out := []string{fmt.Sprintf("live, throttle driver of host %s (%s ago, period %.1fs; %s):", host, ago, st.PeriodS, path)}
		for _, ds := range st.Datastores {
			if ds.Name != d.Datastore {
				continue
			}
			if !ds.SIOC {
				out = append(out, fmt.Sprintf("  datastore %s: no SIOC, no host budget: only limits are set", ds.Name))
				break
			}
			out = append(out, fmt.Sprintf("  host budget %.0f IOPS = window %.2f / threshold %.0f ms; datastore latency %.2f ms over %d hosts, this host's %.2f ms (%d probes)",
				ds.BudgetIOPS, ds.Window, ds.ThresholdMs, ds.DatastoreLatencyMs, ds.HostsSeen, ds.HostLatencyMs, ds.Probes))
			out = append(out, "  "+measuredLine(ds))
			if ds.Error != "" {
				out = append(out, "  error: "+ds.Error)
			}
		}
		dem, held := "unbounded", ""
		if d.DemandIOPS >= 0 {
			dem = fmt.Sprintf("%.0f IOPS", d.DemandIOPS)
		}
		if d.Bound {
			held = ", held by its throttle (it wants more)"
		}
		out = append(out, fmt.Sprintf("  %s (%s %s) did %.0f IOPS, %.2f MB/s at %.2f ms%s; demand %s",
			name, d.VM, d.Target, d.IOPS, d.MBps, d.LatencyMs, held, dem))
		thr := "none (QEMU unthrottled)"
		if d.ThrottleIOPS > 0 {
			thr = fmt.Sprintf("%d IOPS (of 32 KiB units)", d.ThrottleIOPS)
		}
		ent := "unbounded"
		if d.EntitlementIOPS >= 0 {
			ent = fmt.Sprintf("%.0f IOPS", d.EntitlementIOPS)
		}
		out = append(out, fmt.Sprintf("  entitled to %s of the budget; QEMU throttle %s: %s", ent, thr, d.Why))
		return out
	}
	return nil
}
