package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"sluice/lab"
	"sluice/policy"
)

func init() {
	register(command{name: "lab", summary: "build / remove / show a lab of namespaces from a policy file", run: runLab})
}

func labUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice lab up|down|status FILE [-o table|json] [--state-dir DIR]")
	fmt.Fprintln(w, "       sluice lab down --cluster NAME   (when the policy file is gone)")
}

// runLab is `sluice lab up|down|status FILE`.
func runLab(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		labUsage(stderr)
		return exitUsage
	}
	verb := args[0]
	fs := newFlagSet("lab " + verb)
	out := fs.String("o", "table", "output: table or json")
	stateDir := fs.String("state-dir", lab.DefaultStateDir, "directory of state files and logs")
	cluster := fs.String("cluster", "", "cluster name (down/status without a policy file)")
	file, err := labParseArgs(fs, args[1:])
	if err != nil {
		fmt.Fprintln(stderr, flagError(fs, err))
		return exitUsage
	}
	if *out != "table" && *out != "json" {
		if err == nil {
			err = fmt.Errorf("-o must be table or json")
		}
		fmt.Fprintf(stderr, "sluice lab: %v\n", err)
		labUsage(stderr)
		return exitUsage
	}
	var p *policy.Policy
	if file != "" {
		p, err = policy.Load(file)
		if err != nil {
			fmt.Fprintln(stderr, strings.TrimSpace(err.Error()))
			return exitBad
		}
		*cluster = p.Cluster
	}
	if *cluster == "" {
		labUsage(stderr)
		return exitUsage
	}
	switch verb {
	case "up":
		if p == nil {
			labUsage(stderr)
			return exitUsage
		}
		gw := ""
		if _, ok := commands["gateway"]; ok {
			if exe, err := os.Executable(); err == nil {
				gw = exe
			}
		}
		st, err := lab.Up(p, lab.Options{StateDir: *stateDir, PolicyFile: file, Gateway: gw, Log: stderr})
		if err != nil {
			fmt.Fprintf(stderr, "sluice lab up: %s\n", labOneLine(err))
			return exitBad
		}
		fmt.Fprintf(stdout, "lab %s up: %d namespaces, %d processes (state %s)\n", p.Cluster, len(st.Namespaces), len(st.Processes), lab.StatePath(*stateDir, p.Cluster))
		return exitOK
	case "down":
		if err := lab.Down(*cluster, *stateDir); err != nil {
			fmt.Fprintf(stderr, "sluice lab down: %s\n", labOneLine(err))
			return exitBad
		}
		fmt.Fprintf(stdout, "lab %s down\n", *cluster)
		return exitOK
	case "status":
		s, err := lab.GetStatus(*cluster, *stateDir)
		if err != nil {
			fmt.Fprintf(stderr, "sluice lab status: %s\n", labOneLine(err))
			return exitBad
		}
		if *out == "json" {
			b, _ := json.MarshalIndent(s, "", "  ")
			fmt.Fprintln(stdout, string(b))
			return exitOK
		}
		if !s.Up {
			fmt.Fprintf(stdout, "lab %s is down\n", *cluster)
			return exitOK
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tROLE\tADDRESSES\tEXISTS\tDISKS")
		for _, n := range s.Namespaces {
			var as, ds []string
			for _, a := range n.Addrs {
				as = append(as, a.Dev+"="+a.IP)
			}
			for _, d := range n.Disks {
				ds = append(ds, d.URI)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", n.Name, n.Role, strings.Join(as, ","), n.Exists, strings.Join(ds, ","))
		}
		tw.Flush()
		for _, pr := range s.Processes {
			fmt.Fprintf(stdout, "process %s pid %d in %s running=%v\n", pr.Name, pr.PID, pr.Namespace, pr.Running)
		}
		for _, w := range s.Warnings {
			fmt.Fprintf(stdout, "warning: %s\n", w)
		}
		return exitOK
	}
	fmt.Fprintf(stderr, "sluice lab: unknown action %q\n", verb)
	labUsage(stderr)
	return exitUsage
}

// labParseArgs parses flags that may come before or after the one
// positional argument, and returns that argument ("" when absent).
func labParseArgs(fs *flag.FlagSet, args []string) (string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) > 1 {
		return "", fmt.Errorf("unexpected argument %q", pos[1])
	}
	if len(pos) == 0 {
		return "", nil
	}
	return pos[0], nil
}

// oneLine joins a multi-line error into one line.
func labOneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
