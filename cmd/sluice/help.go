package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// helps is the text `sluice CMD --help` prints to stdout (exit 0): the
// usage, what the command does and one example. A key "CMD VERB" is the
// help of a verb (`agent status`).
var helps = map[string]string{
	"validate": `usage: sluice validate FILE

Check a policy file: exit 0 and a one-line summary if it is valid, else
exit 1 and one line per problem: FILE:LINE: field: message.

example:
  sluice validate examples/netioc-fig2.yaml`,

	"alloc": `usage: sluice alloc FILE [--demand PORT=RATE ...] [--unnamed HOST/VM/NIC ...] [-o table|json]

The entitlement of every port and traffic class on every uplink. A demand
is a rate (2Gbps) or unlimited (the default); PORT is VM/NIC or HOST/CLASS.
--unnamed adds a vNIC of a VM that runs on HOST but that the policy does
not name (as the agent sees it): port VM/NIC, with the policy's unnamedVMs.

example:
  sluice alloc examples/netioc-fig2.yaml --demand vm2/nic0=1Gbps -o json`,

	"explain": `usage: sluice explain FILE PORT [--demand PORT=RATE ...] [--unnamed HOST/VM/NIC ...] [--cpu-mhz-per-gbps MHZ]

Why a port (VM/NIC, HOST/CLASS) or a disk (VM/DISK) gets what it gets,
level by level; --unnamed as for alloc. For a vNIC it also says whether
its VM's CPU entitlement can drive its network entitlement, at the CPU
cost of sending measured on its host (the policy's cpu.sendMHzPerGbps
above cpu.sendOverheadMHz), or else the simulator's seed-003 model (105.7
MHz per Gbps, plus 96.3 MHz per Gbps of ACKs up to 507 MHz);
--cpu-mhz-per-gbps replaces the cost per Gbps.

example:
  sluice explain examples/netioc-fig2.yaml vm1/nic0`,

	"place": `usage: sluice place FILE [--change SPEC ...] [--batch] [--threshold 1-5] [--max-moves N]

Admission, placement, fault repair and rebalancing decisions, with reasons:
a pass over FILE as written, then one pass after each --change (after all
of them with --batch). --threshold is how eager rebalancing is, 1
(conservative) to 5 (aggressive); --max-moves caps migrations per pass
(0: no cap).

A change SPEC is TARGET.FIELD[=VALUE]:
  VM.host=HOST                 migrate VM to HOST by hand ("VM.host=": placement chooses)
  VM.memory=SIZE               e.g. 8GiB
  VM.vcpus=N
  VM.cpu.reservation=MHZ       e.g. 2000MHz or 2000
  VM.cpu.shares=low|normal|high|N   a keyword counts per vCPU
  VM.cpu.limit=MHZ             0 or "unlimited" for none
  VM.migratable=true|false
  VM/NIC.reservation=RATE      e.g. 4.5Gbps
  VM/NIC.limit=RATE|unlimited
  VM/NIC.shares=low|normal|high|N
  VM/NIC.uplink=UPLINK         pin to an uplink ("" unpins)
  VM/DISK.reservation=IOPS     e.g. 500
  VM/DISK.shares=low|normal|high|N
  VM/DISK.limit=IOPS|unlimited
  HOST/UPLINK.down             the uplink is lost
  HOST.memory=SIZE, HOST.cores=N, HOST.mhz=N

example:
  sluice place examples/netioc-fig2.yaml --change vm2/nic0.reservation=4.5Gbps`,

	"sim": `usage: sluice sim SCENARIO [-o DIR] [-q] [--live FILE]

Run a simulation scenario: CSV time series, a summary (JSON and text:
measured vs expected) and plots into DIR (default out/sim/NAME); -q leaves
out the summary table. --live FILE gives the live figures (JSON, written by
make reproduce-live) that the scenario's kind: live expectations are judged
on; without them those are pending. Exit 1 when the scenario is bad or an
expectation fails.

example:
  sluice sim scenarios/seeds/netioc-fig2.yaml -o out/fig2`,

	"lab": `usage: sluice lab up|down|status FILE [-o table|json] [--state-dir DIR]
       sluice lab down --cluster NAME   (when the policy file is gone)

Build, remove or show a lab of network namespaces (fabric, hosts, VMs,
datastore) from a policy file (root).

example:
  sluice lab up examples/lab-1g.yaml`,

	"agent status": `usage: sluice agent status --host NAME [--policy FILE] [-o table|json] [--state-dir DIR]

Show a running agent's statistics: every port's bytes, rate, entitlement
and HTB rates per uplink, each VM's CPU, and (table only) the throttle
driver's last period: each datastore's budget, latency and measured
capacity, each disk's I/O and QEMU throttle.

example:
  sluice agent status --host h1 --policy examples/lab-1g.yaml -o json`,

	"gateway": `usage: sluice gateway --host H --policy FILE|--controller URL --token-file F [--ca F]
                      --datastore DS=nbd://IP:PORT|dir:PATH [--period 4s] [--reload 2s] [--status-file FILE] [--cpus N] [--poll DUR]
                      [--socket-dir DIR|none] [--socket-owner USER[:GROUP]] [--socket-mode 0600]
                      [--listen unix:PATH] [--listen ADDR:PORT --tls-cert FILE --tls-key FILE --tls-ca FILE]
                      [--max-conns 1024] [--max-conns-per-vm 64]
                      [--migrate-uri URI --migrate-peer HOST=URI ... [--migrate-data URI]]   (libvirt: live migrations to this host)
                      [--metrics-listen 127.0.0.1:9642|""] [--log-format text|json] [--config /etc/sluice/gateway.yaml]
       sluice gateway status [--host H] [-o table|json] [--dir DIR]
       sluice gateway disk-xml --policy FILE --host H [--socket-dir DIR] VM/DISK

The storage gateway of a host: NBD exports per VM disk with mClock and
PARDA against each datastore (--datastore is repeatable). A datastore is a
directory of volumes (one file VM+DISK.img per disk, e.g. an NFS mount) or
an NBD server with one export per volume; prepare it with 'sluice
datastore create'. Each VM reaches its own disks, and only those, on its
socket DIR/VM.sock (default DIR /run/sluice/gw-CLUSTER-HOST, root-only
0600): nbd+unix:///VM/DISK?socket=DIR/VM.sock. --listen unix:PATH adds a
root-only socket serving every disk; --listen ADDR:PORT serves TCP with
TLS only (a client certificate whose Common Name is the VM). Nothing
listens on TCP by default. The policy file is read again when it changes
(or on SIGHUP): disks (and sockets) of VMs that arrived are served, those
of VMs that left are flushed and closed. With --controller the gateway
follows the controller's policy and its desired state for the host
(migrations included) instead of a file.

example:
  sluice gateway --host h1 --policy examples/lab-1g.yaml --datastore ds1=nbd://198.19.2.1:10809
  sluice gateway --host h1 --policy /etc/sluice/policy.yaml --datastore ds1=dir:/mnt/ds1`,

	"datastore": `usage: sluice datastore create --policy FILE DS=DIR [DS=DIR ...]

Prepare directory DIR as datastore DS: create every missing volume
(VM+DISK.img, a sparse file of the disk's size) and the stats volume
sluice-stats with the datastore's identity. Existing volumes are kept; one
smaller than its disk is an error. Run it again after adding disks.

example:
  sluice datastore create --policy /etc/sluice/policy.yaml ds1=/mnt/ds1`,

	"gateway status": `usage: sluice gateway status [--host H] [-o table|json] [--dir DIR]

Show the status the gateways publish (one file per host in /run/sluice):
windows, latencies and every disk's IOPS.

example:
  sluice gateway status --host h1 -o json`,

	"gateway disk-xml": `usage: sluice gateway disk-xml --policy FILE --host H [--socket-dir DIR] [--reconnect-delay 30] [--form disk|qemu] VM/DISK

Print the libvirt XML that attaches a VM's disk to its host's gateway: a
<disk> with an NBD source on the VM's own socket of the gateway
(--socket-dir as the gateway's, DIR/VM.sock) and QEMU's
reconnect delay (seconds QEMU holds I/O while the gateway restarts), or
with --form qemu a <qemu:commandline> element for libvirt 9.0, which drops
the reconnect delay (docs/storage.md, "QEMU").

example:
  sluice gateway disk-xml --policy examples/lab-1g.yaml --host h1 vm1/disk0`,

	"version": `usage: sluice version

Print the version of sluice and of Go: the version make build sets
(-ldflags "-X main.version=..."; git describe), else the module's, and the
VCS revision, its time and whether the tree was modified when go build
stamped them (a git checkout).

example:
  sluice version`,
}

// wantsHelp reports whether args ask for help (-h, -help, --help) before
// a "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// printHelp writes the help of command name (with its verb, if it has
// help of its own) and reports whether there is one.
func printHelp(w io.Writer, name string, args []string) bool {
	if len(args) > 0 {
		if h, ok := helps[name+" "+args[0]]; ok {
			fmt.Fprintln(w, h)
			return true
		}
	}
	h, ok := helps[name]
	if ok {
		fmt.Fprintln(w, h)
	}
	return ok
}

func init() {
	register(command{name: "version", summary: "print the version of sluice", run: runVersion})
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: sluice version")
		return exitUsage
	}
	fmt.Fprintln(stdout, versionText())
	return exitOK
}

// version is sluice's version when the build sets it (make build:
// -ldflags "-X main.version=$(git describe --always --dirty)"); "" means
// the module's version from the build information.
var version string

// build is what a binary knows of its build.
type build struct {
	version  string // -X main.version, else the module's, else (devel)
	revision string // vcs.revision (go build in a git checkout)
	time     string // vcs.time: the revision's commit time
	modified bool   // vcs.modified: built with uncommitted changes
	goVer    string
}

func readBuild() build { return buildFrom(version, debug.ReadBuildInfo) }

// buildFrom is readBuild with the override and the build information
// given (tests).
func buildFrom(override string, read func() (*debug.BuildInfo, bool)) build {
	b := build{version: override, goVer: runtime.Version()}
	bi, ok := read()
	if ok {
		b.goVer = bi.GoVersion
		if b.version == "" && bi.Main.Version != "" {
			b.version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.revision = s.Value
			case "vcs.time":
				b.time = s.Value
			case "vcs.modified":
				b.modified = s.Value == "true"
			}
		}
	}
	if b.version == "" {
		b.version = "(devel)"
	}
	return b
}

// versionText is "sluice VERSION (REVISION, TIME[, modified]) GOVERSION",
// the parenthesis when the build knows its revision.
func versionText() string { return readBuild().text() }

func (b build) text() string {
	var rev []string
	if b.revision != "" {
		rev = append(rev, b.revision[:min(12, len(b.revision))])
		if b.time != "" {
			rev = append(rev, b.time)
		}
		if b.modified {
			rev = append(rev, "modified")
		}
	}
	out := "sluice " + b.version
	if len(rev) > 0 {
		out += " (" + strings.Join(rev, ", ") + ")"
	}
	return out + " " + b.goVer
}
