package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sluice/controller"
	"sluice/entitle"
	"sluice/internal/inputfile"
	"sluice/policy"
)

func init() {
	register(command{name: "ctl", summary: "talk to the controller: apply, get, set, what-if, explain, power-on, migrate, approve", run: runCtl})
	const conn = `
Connection (before or after the verb): --server URL (default
https://127.0.0.1:7443), --token-file FILE (default DATA-DIR/token),
--ca FILE (default DATA-DIR/tls/cert.pem), --data-dir DIR (default
/var/lib/sluice/controller or $SLUICE_CONTROLLER_DIR). -o table|json.
Verbs' own: -f FILE (--file), --reason TEXT, --on HOST, --to HOST,
--after SEQ (get events: those after event SEQ).`
	helps["ctl"] = `usage: sluice ctl [--server URL] [--token-file FILE] [--ca FILE] [-o table|json] VERB ...

verbs:
  apply -f FILE [--reason TEXT]         validate FILE and make it the policy
  get hosts|vms|events|decisions|policy
  set TARGET FIELD=VALUE ... [--reason TEXT]
  what-if CHANGE ...                    what set would do (admission, migrations, rates), nothing changed
  explain PORT                          why PORT (VM/NIC, HOST/CLASS, VM/DISK) gets what it gets
  power-on VM [--on HOST] [--reason TEXT]
  migrate VM --to HOST [--reason TEXT]
  approve DECISION [--reason TEXT]      carry out a recommended migration (DRS manual)
  token HOST                            print a new token line for HOST's agent (no connection)
` + conn + `

example:
  sluice ctl set vm1/nic0 reservation=7.5Gbps --reason "step a"`
	helps["ctl apply"] = `usage: sluice ctl apply -f FILE [--reason TEXT]

Validate the policy FILE (problems one per line: FILE:LINE: field: message)
and make it the policy in force; VMs with a host in FILE run there.
` + conn + `

example:
  sluice ctl apply -f examples/netioc-fig2.yaml`
	helps["ctl get"] = `usage: sluice ctl get hosts|vms|events|decisions|policy [--after SEQ] [-o table|json]

List the hosts (registered or not), the VMs (host, state, every vNIC's
R/S/L and rate with unbounded demand), the events with their reasons, the
recorded migrations, or the policy document and the changes since.
` + conn + `

example:
  sluice ctl get events -o json`
	helps["ctl set"] = `usage: sluice ctl set TARGET FIELD=VALUE ... [--reason TEXT]

Change the policy, all fields at once or none, with placement's grammar
(sluice place --help): TARGET is VM, VM/NIC, VM/DISK or HOST; FIELD is
reservation, shares, limit, uplink (VM/NIC); reservation, shares, limit
in IOPS (VM/DISK; iops= is reservation=); cpu.reservation, cpu.shares,
cpu.limit, memory, vcpus (VM; cpu= is cpu.reservation=). Every field
reaches the VM's host (its desired state). A change that breaks the
reservations of the VMs that run on its host is made and reported as a
fault with placement's repair; one no migration can mend is refused,
and nothing is written.
` + conn + `

example:
  sluice ctl set vm2/nic0 reservation=4.5Gbps shares=high`
	helps["ctl what-if"] = `usage: sluice ctl what-if CHANGE ... [--reason TEXT]

What sluice ctl set would do with the changes, on the cluster as it runs
now, without making them: admitted or refused (with the reason), the
events it would record, the migrations placement would make (moving with
--drs automatic, recommended with manual), where the VMs would then run,
and every vNIC's rate before and after (every demand unbounded, the
migrations carried out). Each CHANGE is TARGET.FIELD=VALUE (sluice place
--help), as many as set takes. Nothing is written; exit 0 when admitted,
1 when refused.
` + conn + `

example:
  sluice ctl what-if vm2/nic0.reservation=4.5Gbps`
	helps["ctl explain"] = `usage: sluice ctl explain PORT

Why a port (VM/NIC, HOST/CLASS) or disk (VM/DISK) gets what it gets, level
by level, with the VMs where the controller runs them.
` + conn + `

example:
  sluice ctl explain vm1/nic0`
	helps["ctl power-on"] = `usage: sluice ctl power-on VM [--on HOST] [--reason TEXT]

Power a VM on: on HOST, else where placement puts it. Refused (exit 1) with
the reason when its reservations fit on no host.
` + conn + `

example:
  sluice ctl power-on vm4`
	helps["ctl migrate"] = `usage: sluice ctl migrate VM --to HOST [--reason TEXT]

Move VM to HOST (refused when it does not fit there): its placement
changes at once and the agents carry the move out; the decision is moving,
then done when the destination's agent reports the VM.
` + conn + `

example:
  sluice ctl migrate vm2 --to h2`
	helps["ctl token"] = `usage: sluice ctl token HOST

Print a new line for the controller's tokens file (--tokens): a random
token that acts as HOST's agent only (it may register HOST, report for
it, read its desired state and ask admission on it). Append the line to
the tokens file, restart the controller, and give the same line to
HOST's agent as its --token-file. Nothing is sent anywhere.

example:
  sluice ctl token h1 | tee -a /etc/sluice/tokens > h1.token`
	helps["ctl approve"] = `usage: sluice ctl approve DECISION [--reason TEXT]

Carry out a migration that DRS recommended (controller --drs manual):
DECISION is its number in sluice ctl get decisions. Refused (exit 1) when
the VM no longer runs on the decision's source or no longer fits on its
destination.
` + conn + `

example:
  sluice ctl approve 7`
}

// ctlArgs is the parsed command line of sluice ctl.
type ctlArgs struct {
	server, tokenFile, ca, dataDir, output string
	file, reason, on, to                   string
	after                                  int64
	pos                                    []string // the verb and its arguments
}

// ctlFlags are ctl's flags as its help spells them (--output and --file
// are -o's and -f's other names).
var ctlFlags = []string{"--server", "--token-file", "--ca", "--data-dir", "-o", "-f", "--reason", "--on", "--to", "--after"}

func parseCtlArgs(args []string) (ctlArgs, error) {
	a := ctlArgs{output: "table", dataDir: defaultDataDir(), server: "https://" + defaultListen}
	flags := map[string]*string{"--server": &a.server, "--token-file": &a.tokenFile, "--ca": &a.ca, "--data-dir": &a.dataDir,
		"-o": &a.output, "--output": &a.output, "-f": &a.file, "--file": &a.file, "--reason": &a.reason, "--on": &a.on, "--to": &a.to}
	var after string
	flags["--after"] = &after
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			a.pos = append(a.pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			a.pos = append(a.pos, arg)
			continue
		}
		name, val, hasVal := strings.Cut(arg, "=")
		if strings.HasPrefix(name, "-") && !strings.HasPrefix(name, "--") && len(name) > 2 {
			name = "-" + name // -server is --server
		}
		dst, ok := flags[name]
		if !ok {
			return a, usageError{msg: "unknown flag " + name, flag: name, known: ctlFlags}
		}
		if !hasVal {
			if i+1 >= len(args) {
				return a, usageError{msg: fmt.Sprintf("flag %s needs a value", name)}
			}
			i++
			val = args[i]
		}
		*dst = val
	}
	if a.output != "table" && a.output != "json" {
		return a, usageError{msg: fmt.Sprintf("-o %s: want table or json", a.output)}
	}
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil || n < 0 {
			return a, usageError{msg: fmt.Sprintf("--after %s: want an event number", after)}
		}
		a.after = n
	}
	if len(a.pos) == 0 {
		return a, usageError{msg: "missing VERB (apply, get, set, what-if, explain, power-on, migrate, approve, token)"}
	}
	want := map[string][2]int{"apply": {1, 1}, "get": {2, 2}, "set": {3, 1 << 20}, "what-if": {2, 1 << 20}, "explain": {2, 2}, "power-on": {2, 2}, "migrate": {2, 2}, "approve": {2, 2}, "token": {2, 2}}
	n, ok := want[a.pos[0]]
	if !ok {
		return a, usageError{msg: fmt.Sprintf("unknown verb %q (apply, get, set, what-if, explain, power-on, migrate, approve, token)", a.pos[0])}
	}
	if len(a.pos) < n[0] || len(a.pos) > n[1] {
		return a, usageError{msg: fmt.Sprintf("%s: wrong number of arguments (sluice ctl %s --help)", a.pos[0], a.pos[0])}
	}
	switch a.pos[0] {
	case "apply":
		if a.file == "" {
			return a, usageError{msg: "apply: missing -f FILE"}
		}
	case "get":
		switch a.pos[1] {
		case "hosts", "vms", "events", "decisions", "policy":
		default:
			return a, usageError{msg: fmt.Sprintf("get %s: want hosts, vms, events, decisions or policy", a.pos[1])}
		}
	case "migrate":
		if a.to == "" {
			return a, usageError{msg: "migrate: missing --to HOST"}
		}
	case "approve":
		if n, err := strconv.ParseInt(a.pos[1], 10, 64); err != nil || n <= 0 {
			return a, usageError{msg: fmt.Sprintf("approve %s: want a decision number", a.pos[1])}
		}
	}
	return a, nil
}

// setChanges turns `TARGET FIELD=VALUE ...` into placement's changes.
func setChanges(target string, fields []string) ([]string, error) {
	var out []string
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, usageError{msg: fmt.Sprintf("set %s %s: want FIELD=VALUE", target, f)}
		}
		switch {
		case k == "iops" && strings.Contains(target, "/"):
			k = "reservation"
		case k == "cpu" && !strings.Contains(target, "/"):
			k = "cpu.reservation"
		}
		out = append(out, target+"."+k+"="+v)
	}
	return out, nil
}

func runCtl(args []string, stdout, stderr io.Writer) int {
	a, err := parseCtlArgs(args)
	if ue, ok := err.(usageError); ok && ue.flag != "" {
		fmt.Fprintln(stderr, unknownFlag("ctl", ue.flag, ue.known))
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice ctl: %v (sluice ctl --help)\n", err)
		return exitUsage
	}
	if a.pos[0] == "token" {
		line, err := controller.NewHostToken(a.pos[1])
		if err != nil {
			fmt.Fprintf(stderr, "sluice ctl: token %s: %v (sluice ctl token --help)\n", a.pos[1], err)
			return exitUsage
		}
		fmt.Fprintln(stdout, line)
		return exitOK
	}
	var changes []string
	if a.pos[0] == "set" {
		if changes, err = setChanges(a.pos[1], a.pos[2:]); err != nil {
			fmt.Fprintf(stderr, "sluice ctl: %v (sluice ctl set --help)\n", err)
			return exitUsage
		}
	}
	fail := func(err error) int {
		var e *controller.Error
		if errors.As(err, &e) && len(e.Body.Problems) > 0 {
			for _, p := range e.Body.Problems {
				fmt.Fprintln(stderr, p)
			}
			return exitBad
		}
		msg := strings.Join(strings.Fields(err.Error()), " ")
		if e != nil && len(e.Body.Details) > 0 {
			msg += " (" + strings.Join(e.Body.Details, "; ") + ")"
		}
		fmt.Fprintf(stderr, "sluice ctl: %s\n", msg)
		return exitBad
	}
	cl, err := ctlClient(a)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out any
	code := exitOK
	switch a.pos[0] {
	case "apply":
		data, err := inputfile.Read(a.file, policy.MaxFileBytes)
		if err != nil {
			return fail(err)
		}
		out, err = cl.Apply(ctx, controller.ApplyRequest{File: a.file, Document: string(data), Reason: a.reason})
		if err != nil {
			return fail(err)
		}
	case "set":
		if out, err = cl.Set(ctx, controller.SetRequest{Changes: changes, Reason: a.reason}); err != nil {
			return fail(err)
		}
	case "what-if":
		w, err := cl.WhatIf(ctx, controller.SetRequest{Changes: a.pos[1:], Reason: a.reason})
		if err != nil {
			return fail(err)
		}
		if !w.Admitted {
			code = exitBad
		}
		out = w
	case "power-on":
		if out, err = cl.PowerOn(ctx, a.pos[1], controller.PowerOnRequest{Host: a.on, Reason: a.reason}); err != nil {
			return fail(err)
		}
	case "migrate":
		if out, err = cl.Migrate(ctx, a.pos[1], controller.MigrateRequest{To: a.to, Reason: a.reason}); err != nil {
			return fail(err)
		}
	case "approve":
		seq, _ := strconv.ParseInt(a.pos[1], 10, 64)
		if out, err = cl.Approve(ctx, seq, a.reason); err != nil {
			return fail(err)
		}
	case "explain":
		if out, err = cl.Explain(ctx, a.pos[1]); err != nil {
			return fail(err)
		}
	case "get":
		switch a.pos[1] {
		case "hosts":
			out, err = cl.Hosts(ctx)
		case "vms":
			out, err = cl.VMs(ctx)
		case "events":
			out, err = cl.Events(ctx, a.after)
		case "decisions":
			out, err = cl.Decisions(ctx)
		case "policy":
			out, err = cl.Policy(ctx)
		}
		if err != nil {
			return fail(err)
		}
	}
	if a.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return code
	}
	printCtlTable(stdout, out)
	return code
}

// ctlClient builds the client from the flags and the data directory's
// token and certificate.
func ctlClient(a ctlArgs) (*controller.Client, error) {
	tf := a.tokenFile
	if tf == "" {
		tf = filepath.Join(a.dataDir, controller.TokenFile)
	}
	tok, err := controller.ReadToken(tf)
	if err != nil {
		return nil, fmt.Errorf("token: %v (give --token-file)", err)
	}
	ca := a.ca
	if ca == "" {
		if def := filepath.Join(a.dataDir, controller.CertFile); fileExists(def) {
			ca = def
		}
	}
	return controller.NewClient(a.server, tok, ca)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func printCtlTable(w io.Writer, out any) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	rate := func(p *float64) string {
		if p == nil {
			return "unlimited"
		}
		return entitle.FormatBps(*p)
	}
	switch v := out.(type) {
	case controller.Result:
		for _, e := range v.Events {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t(%s)\n", e.Seq, e.Kind, e.Subject, e.Message, e.Reason)
		}
		fmt.Fprintf(tw, "policy revision %d\n", v.Revision)
	case controller.WhatIfResult:
		printWhatIf(tw, v)
	case controller.Explanation:
		for _, l := range v.Lines {
			fmt.Fprintln(tw, l)
		}
	case []controller.HostInfo:
		fmt.Fprintln(tw, "HOST\tREGISTERED\tVMS\tUPLINKS\tRESERVED")
		for _, h := range v {
			fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", h.Name, h.Registered, orDash(strings.Join(h.VMs, ",")), orDash(strings.Join(h.Uplinks, ",")), entitle.FormatBps(h.ReservedBps))
		}
	case []controller.VMInfo:
		fmt.Fprintln(tw, "VM\tDESIRED\tOBSERVED\tSTATE\tSINCE\tPORT\tUPLINK\tRESERVATION\tSHARES\tLIMIT\tRATE")
		for _, vm := range v {
			since := "-"
			if !vm.Since.IsZero() {
				since = vm.Since.Local().Format(time.DateTime)
			}
			head := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", vm.Name, orDash(vm.Host), orDash(vm.Observed), vm.State, since)
			if len(vm.NICs) == 0 {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\n", head)
			}
			for _, n := range vm.NICs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\n", head, n.Port, orDash(n.Uplink),
					entitle.FormatBps(n.ReservationBps), n.Shares, rate(n.LimitBps), entitle.FormatBps(n.AllocBps))
			}
		}
	case []controller.Event:
		fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tSUBJECT\tMESSAGE\tREASON")
		for _, e := range v {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Local().Format(time.DateTime), e.Kind, e.Subject, e.Message, e.Reason)
		}
	case []controller.Decision:
		fmt.Fprintln(tw, "SEQ\tTIME\tVM\tFROM\tTO\tSTATUS\tREASON")
		for _, d := range v {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Seq, d.Time.Local().Format(time.DateTime), d.VM, d.From, d.To, d.Status, d.Reason)
		}
	case controller.PolicyState:
		fmt.Fprintf(tw, "# %s, revision %d, applied %s\n", v.File, v.Revision, v.AppliedAt.Local().Format(time.DateTime))
		for _, c := range v.Changes {
			fmt.Fprintf(tw, "# then: %s\n", c)
		}
		io.WriteString(tw, v.Document)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printWhatIf prints a what-if's answer: the verdict, the events, the
// moves, where the VMs would run and the rates before and after.
func printWhatIf(tw *tabwriter.Writer, w controller.WhatIfResult) {
	if !w.Admitted {
		fmt.Fprintf(tw, "refused (policy revision %d): %s\n", w.Revision, w.Refusal)
		for _, d := range w.Details {
			fmt.Fprintf(tw, "  %s\n", d)
		}
		return
	}
	fmt.Fprintf(tw, "admitted (policy revision %d, DRS %s); nothing was changed\n", w.Revision, w.DRS)
	for _, e := range w.Events {
		fmt.Fprintf(tw, "would record\t%s\t%s\t%s\t(%s)\n", e.Kind, e.Subject, e.Message, e.Reason)
	}
	for _, m := range w.Moves {
		fmt.Fprintf(tw, "migration\t%s %s → %s (%s)\t%s\n", m.VM, m.From, m.To, m.Status, m.Reason)
	}
	for _, h := range w.Hosts {
		fmt.Fprintf(tw, "host %s\t%s\n", h.Host, strings.Join(h.VMs, ","))
	}
	for _, f := range w.Faults {
		fmt.Fprintf(tw, "still a fault\t%s\n", f)
	}
	fmt.Fprintln(tw, "PORT\tUPLINK\tRATE NOW\tRATE AFTER")
	for _, r := range w.Rates {
		now := "-"
		if r.BeforeUplink != "" {
			now = entitle.FormatBps(r.BeforeBps) + " on " + r.BeforeUplink
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Port, r.Uplink, now, entitle.FormatBps(r.AllocBps))
	}
}
