package main

import (
	"fmt"
	"io"
)

func init() {
	register(command{
		name:    "validate",
		summary: "check a policy file; exit 1 and one line per problem if it is not valid",
		run:     runValidate,
	})
}

const validateUsage = "usage: sluice validate FILE"

func runValidate(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprintln(stdout, validateUsage)
		return exitOK
	}
	if len(args) != 1 || len(args[0]) > 1 && args[0][0] == '-' {
		fmt.Fprintln(stderr, validateUsage)
		return exitUsage
	}
	p, code := loadPolicy(args[0], stderr)
	if p == nil {
		return code
	}
	nics, disks := 0, 0
	for _, vm := range p.VMs {
		nics += len(vm.NICs)
		disks += len(vm.Disks)
	}
	fmt.Fprintf(stdout, "%s: ok: %s, %s, %s, %s, %s\n", args[0],
		plural(len(p.Hosts), "host"), plural(len(p.VMs), "VM"), plural(nics, "vNIC"),
		plural(disks, "disk"), plural(len(p.Datastores), "datastore"))
	return exitOK
}
