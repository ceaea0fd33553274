package main

import (
	"fmt"
	"io"

	"sluice/entitle"
	"sluice/policy"
)

func init() {
	register(command{
		name:    "explain",
		summary: "why a port (VM/NIC, HOST/CLASS) or disk (VM/DISK) gets what it gets, level by level",
		run:     runExplain,
	})
}

const explainUsage = "usage: sluice explain FILE PORT [--demand PORT=RATE ...]"

func runExplain(args []string, stdout, stderr io.Writer) int {
	a, code, ok := parseOrExit(args, explainUsage, stdout, stderr)
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
	n, err := entitle.Network(p, a.demands)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return exitBad
	}
	lines, err := n.Explain(port)
	if err != nil {
		if dl, ok := explainDisk(p, port); ok {
			lines, err = dl, nil
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %s: no such port or disk (ports are VM/NIC of a placed VM or HOST/CLASS; disks VM/DISK)\n", port)
		return exitBad
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return exitOK
}

// explainDisk explains a disk VM/DISK on its datastore at the array's
// nominal rate, with every disk's demand unbounded.
func explainDisk(p *policy.Policy, name string) ([]string, bool) {
	for _, ds := range p.Datastores {
		s, err := entitle.Storage(p, ds.Name, 0, nil)
		if err != nil || s.Disk(name) == nil {
			continue
		}
		lines, err := s.Explain(name)
		return lines, err == nil
	}
	return nil, false
}
