package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"sluice/agent"
	"sluice/controller"
	"sluice/lab"
	"sluice/storage"
	"sluice/top"
)

func init() {
	register(command{name: "top", summary: "live view of a host: per VM and vNIC entitled vs measured, CPU, disks", run: runTop})
	helps["top"] = `usage: sluice top --host NAME [--policy FILE] [--state-dir /run/sluice] [--gateway-dir /run/sluice]
                  [--interval 1s] [--sort name|entitled|rate|%ent|cpu|ready|throttled|iops] [--once]
       sluice top --controller URL --token-file FILE [--ca FILE] [--host NAME] [--interval 1s] [--sort ...] [--once]

A live view of one host, like esxtop: per VM and vNIC (and per host
traffic class) the entitlement against the measured rate (payload, at the
uplink's usable rate), the VM's CPU (used, ready, throttled, in percent of
one core) and its disks' IOPS against their entitlement, with why the
selected row gets what it gets. It reads the host's agent statistics file
(STATE-DIR/agent-CLUSTER-HOST.json, the agent's --state-dir) and the
gateways' status files (GATEWAY-DIR/gateway-*.json), every --interval; it
changes nothing. With --controller it shows the cluster as the controller
sees it instead: every port of every host reporting (only those of --host
when given), its last measured rate beside the entitlement of its host's
desired state (GET /v1/history, the web console's source). Keys: ↑/↓ (j/k) select; n e r p c y t i sort by name,
entitled, rate, %ent, cpu, ready, throttled, iops; q quits. --once prints
one screen and exits (no terminal needed).

example:
  sluice top --host h1 --policy examples/lab-1g.yaml --sort rate`
}

func runTop(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("top")
	host := fs.String("host", "", "host name")
	file := fs.String("policy", "", "policy file (to find the cluster; default: the one agent statistics file of HOST)")
	stateDir := fs.String("state-dir", lab.DefaultStateDir, "the agent's --state-dir (its statistics file)")
	gwDir := fs.String("gateway-dir", statusDir, "directory of the gateways' status files")
	interval := fs.Duration("interval", time.Second, "refresh period")
	sortBy := fs.String("sort", "name", "sort column: name, entitled, rate, %ent, cpu, ready, throttled, iops")
	once := fs.Bool("once", false, "print one screen and exit")
	var cf controllerFlags
	cf.registerClient(fs, "the controller's URL (https://HOST:PORT): show the cluster as it sees it")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	col, ok := topColumn(*sortBy)
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "sluice top: unexpected argument %s; see 'sluice top --help'\n", fs.Arg(0))
		return exitUsage
	case *host == "" && cf.server == "":
		fmt.Fprintln(stderr, "sluice top: --host or --controller is required; see 'sluice top --help'")
		return exitUsage
	case *interval <= 0:
		fmt.Fprintln(stderr, "sluice top: --interval must be positive")
		return exitUsage
	case !ok:
		fmt.Fprintf(stderr, "sluice top: --sort %s: want one of name, entitled, rate, %%ent, cpu, ready, throttled, iops\n", *sortBy)
		return exitUsage
	}
	cluster := ""
	if *file != "" {
		p, code := loadPolicy(*file, stderr)
		if p == nil {
			return code
		}
		cluster = p.Cluster
	}
	var load func() top.Snapshot
	if cf.server != "" {
		cl, err := cf.client()
		if err != nil {
			fmt.Fprintf(stderr, "sluice top: %v\n", err)
			return exitUsage
		}
		load = func() top.Snapshot { return controllerSnapshot(cl, cf.server, *host, *interval) }
	} else {
		load = localLoad(*stateDir, *gwDir, cluster, *host)
	}
	if *once {
		s := load()
		fmt.Fprint(stdout, top.Render(s, top.View{Sort: col}))
		if s.Err != nil {
			fmt.Fprintf(stderr, "sluice top: %s\n", labOneLine(s.Err))
			return exitBad
		}
		return exitOK
	}
	prog := tea.NewProgram(top.NewModel(load, *interval, col), tea.WithAltScreen(), tea.WithOutput(stdout))
	if _, err := prog.Run(); err != nil {
		fmt.Fprintf(stderr, "sluice top: %v\n", err)
		return exitBad
	}
	return exitOK
}

// controllerSnapshot reads the controller's view: each port's last
// history sample (of host's ports only, when host is given), within
// timeout.
func controllerSnapshot(cl *controller.Client, server, host string, timeout time.Duration) top.Snapshot {
	s := top.Snapshot{At: time.Now(), Controller: server, Ports: []top.PortSample{}}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	h, err := cl.History(ctx, "")
	if err != nil {
		s.Err = err
		return s
	}
	for _, p := range h.Ports {
		if len(p.Samples) == 0 {
			continue
		}
		last := p.Samples[len(p.Samples)-1]
		if host != "" && last.Host != host {
			continue
		}
		s.Ports = append(s.Ports, top.PortSample{Host: last.Host, Port: p.Port, EntitledBps: last.EntitledBps, MeasuredBps: last.MeasuredBps, At: last.Time})
	}
	return s
}

// localLoad reads host's agent statistics (in stateDir, of cluster: ""
// for the one file of host) and its gateways' status files in gwDir.
func localLoad(stateDir, gwDir, cluster, host string) func() top.Snapshot {
	return func() top.Snapshot {
		s := top.Snapshot{At: time.Now()}
		s.Agent, s.Err = agent.ReadStats(stateDir, cluster, host)
		files, _ := filepath.Glob(filepath.Join(gwDir, "gateway-*.json"))
		sort.Strings(files)
		for _, f := range files {
			if st, err := storage.ReadStatusFile(f); err == nil && st.Host == host {
				s.Gateways = append(s.Gateways, st)
			}
		}
		return s
	}
}

// topColumn is the column of a --sort name.
func topColumn(name string) (top.Column, bool) {
	for c := top.ByName; c <= top.ByIOPS; c++ {
		if c.String() == strings.ToLower(name) {
			return c, true
		}
	}
	return 0, false
}
