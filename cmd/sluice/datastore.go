package main

import (
	"fmt"
	"io"
	"strings"

	"sluice/policy"
	"sluice/storage"
)

func init() {
	register(command{
		name:    "datastore",
		summary: "prepare a datastore directory: one volume file per VM disk and the shared stats volume ('datastore create')",
		run:     runDatastore,
	})
}

const datastoreUsage = "usage: sluice datastore create --policy FILE DS=DIR [DS=DIR ...]"

// runDatastore is `sluice datastore create`: it makes every missing volume
// of the named datastores (sized from the policy) and the stats volume
// with the datastore's identity. Existing volumes are kept; one smaller
// than its disk is an error.
func runDatastore(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "create" {
		fmt.Fprintln(stderr, datastoreUsage)
		return exitUsage
	}
	fs := newFlagSet("datastore create")
	pol := fs.String("policy", "", "policy file (required)")
	if err := fs.Parse(args[1:]); err != nil || *pol == "" || fs.NArg() == 0 {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		fmt.Fprintln(stderr, datastoreUsage)
		return exitUsage
	}
	p, code := loadPolicy(*pol, stderr)
	if p == nil {
		return code
	}
	for _, a := range fs.Args() {
		ds, dir, ok := strings.Cut(a, "=")
		dir = strings.TrimPrefix(dir, "dir:")
		if !ok || ds == "" || dir == "" {
			fmt.Fprintf(stderr, "sluice datastore create: %q: want DS=DIR\n", a)
			return exitUsage
		}
		if d := p.Datastore(ds); d != nil && d.DriverAt(true) != policy.DriverGateway {
			fmt.Fprintf(stderr, "sluice datastore create: datastore %s has driver %s: its disks are the operator's own images, which QEMU opens itself (docs/throttle.md); datastore create prepares the gateway's volumes\n", ds, d.Driver)
			return exitBad
		}
		created, err := storage.CreateVolumes(dir, p, ds)
		for _, c := range created {
			fmt.Fprintf(stdout, "created %s/%s\n", dir, c)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice datastore create: %v\n", err)
			return exitBad
		}
	}
	return exitOK
}
