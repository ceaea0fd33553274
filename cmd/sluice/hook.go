package main

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"sluice/admit"
	"sluice/agent"
	"sluice/lab"
	"sluice/policy"
	"sluice/virt"
)

// The libvirt hook: `sluice hook install` writes /etc/libvirt/hooks/qemu,
// which runs `sluice hook qemu` when a domain is about to start; the
// decision itself is package admit's.

const (
	defaultHooksDir = "/etc/libvirt/hooks"
	// hookMarker is in every hook script sluice writes: install replaces
	// only its own, uninstall removes only its own.
	hookMarker = "# sluice admission hook"
	// chainedSuffix is the name an existing qemu hook is kept under; the
	// sluice hook runs it after its own decision.
	chainedSuffix = ".sluice-chained"
	// libvirtRunDir holds the status XML of each running QEMU domain.
	libvirtRunDir = "/run/libvirt/qemu"
)

func init() {
	register(command{name: "hook", summary: "libvirt hook: admission of a VM at its start (hook install|uninstall|qemu)", run: runHook})
	helps["hook"] = hookUsage + `

Admission at VM start on a libvirt host. 'install' writes the executable
hook /etc/libvirt/hooks/qemu (an existing one is kept as qemu.sluice-chained
and still run after sluice admits) and signals libvirtd (SIGHUP) to see it.
libvirtd then runs 'sluice hook qemu' before each domain starts, which asks
the host's agent (its admission socket, --agent): the agent refuses a
domain whose reservations (vNICs, CPU MHz, memory, IOPS) do not fit the
host with the domains running there and those the controller starts or
moves there, by the policy it enforces (the controller's, with every
change since, or its file), and libvirt's error carries the reason. When
the agent does not answer, the --policy file decides; when neither can,
--unreachable says: closed (the default) refuses, open admits.
'uninstall' removes it and restores the chained hook.

example:
  sudo sluice hook install --host pve1 --policy /etc/sluice/policy.yaml`
}

const hookUsage = `usage: sluice hook install [--host NAME] [--policy FILE] [--agent SOCKET] [--unreachable closed|open] [--hooks-dir DIR] [--no-reload] [--sluice PATH]
       sluice hook uninstall [--hooks-dir DIR] [--no-reload]
       sluice hook qemu --host NAME [--policy FILE] [--agent SOCKET] [--unreachable closed|open] -- DOMAIN OPERATION SUBOP EXTRA < DOMAIN-XML`

func runHook(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, hookUsage)
		return exitUsage
	}
	switch args[0] {
	case "install":
		return runHookInstall(args[1:], stdout, stderr)
	case "uninstall":
		return runHookUninstall(args[1:], stdout, stderr)
	case "qemu":
		return runHookQemu(args[1:], os.Stdin, stderr, libvirtRunDir)
	}
	fmt.Fprintln(stderr, hookUsage)
	return exitUsage
}

// runHookQemu is what libvirtd runs: `DOMAIN OPERATION SUBOP EXTRA` with
// the domain's XML on stdin. Only `prepare begin` (before the domain
// starts) is decided; a refusal is printed on stderr (libvirt puts it in
// its error) with exit 1. It must not call libvirt (libvirtd waits for
// it). The host's agent decides (its admission socket: the policy it
// enforces, the controller's when it follows one, and the VMs starting
// there); when the agent does not answer, the policy file decides (the
// running domains read from libvirt's status files), and without one
// --unreachable says (closed, the default: refused).
func runHookQemu(args []string, stdin io.Reader, stderr io.Writer, runDir string) int {
	fs := newFlagSet("hook qemu")
	file := fs.String("policy", "", "policy file: decides when the agent does not answer")
	host := fs.String("host", "", "this host's name in the policy")
	sock := fs.String("agent", "", "the agent's admission socket (default: "+agent.AdmitSocket(lab.DefaultStateDir, "HOST")+")")
	unreachable := fs.String("unreachable", "closed", "when neither the agent nor a policy file can decide: closed (refuse) or open (admit)")
	if err := fs.Parse(args); err != nil || *host == "" || fs.NArg() < 3 || (*unreachable != "closed" && *unreachable != "open") {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		fmt.Fprintln(stderr, hookUsage)
		return exitUsage
	}
	name, op, sub := fs.Arg(0), fs.Arg(1), fs.Arg(2)
	if op != "prepare" || sub != "begin" {
		return exitOK
	}
	if *sock == "" {
		*sock = agent.AdmitSocket(lab.DefaultStateDir, *host)
	}
	// undecided ends a hook that nobody could answer: --unreachable.
	undecided := func(why string) int {
		if *unreachable == "open" {
			say(stderr, fmt.Sprintf("sluice: %s; %s starts without an admission check (--unreachable open)", why, name))
			return exitOK
		}
		say(stderr, fmt.Sprintf("sluice: refused %s: %s, and the hook fails closed (sluice hook install --unreachable open admits then)", name, why))
		return exitBad
	}
	dom := admit.Domain{Name: name}
	b, err := io.ReadAll(io.LimitReader(stdin, maxDomainXML+1))
	switch {
	case err != nil:
		return undecided(fmt.Sprintf("reading the domain XML: %v", err))
	case len(b) > maxDomainXML:
		return undecided(fmt.Sprintf("the domain XML is larger than %d MiB", maxDomainXML>>20))
	}
	d, err := virt.ParseDomainXML(b)
	if err != nil {
		return undecided(fmt.Sprintf("the domain XML does not parse (%s)", labOneLine(err)))
	}
	dom.UUID = d.UUID
	for _, i := range d.Interfaces {
		if i.Type != "hostdev" {
			dom.VNICs++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), hookAgentTimeout)
	dec, aerr := agent.AskAdmit(ctx, *sock, dom)
	cancel()
	if aerr != nil {
		if *file == "" {
			return undecided(fmt.Sprintf("the agent at %s does not answer (%s) and no policy file is given", *sock, labOneLine(aerr)))
		}
		p, err := policy.Load(*file)
		if err != nil {
			return undecided(fmt.Sprintf("the agent at %s does not answer (%s) and the policy %s does not load (%s)", *sock, labOneLine(aerr), *file, labOneLine(err)))
		}
		running, err := runningDomains(runDir)
		if err != nil {
			return undecided(fmt.Sprintf("the agent at %s does not answer (%s) and %s", *sock, labOneLine(aerr), labOneLine(err)))
		}
		// One line either way: libvirt's error carries the first line of
		// the hook's stderr.
		note := fmt.Sprintf("the agent at %s does not answer (%s): %s decided", *sock, labOneLine(aerr), *file)
		if m := lastMeasured(statusDir, filepath.Dir(*sock), p.Cluster, *host); len(m) > 0 {
			p = p.WithMeasuredIOPS(m)
			note += ", with the capacities this host measured last"
		}
		if dec = admit.Decide(p, *host, dom, running); !dec.Allow {
			say(stderr, fmt.Sprintf("%s (%s)", dec.String(), note))
			return exitBad
		}
		say(stderr, "sluice: "+note)
		return exitOK
	}
	if !dec.Allow {
		say(stderr, dec.String())
		return exitBad
	}
	return exitOK
}

// say writes the hook's one line: libvirt's error carries the first line
// of the hook's stderr, and a domain's name may hold any character, so
// control characters are written escaped (a newline as \n).
func say(w io.Writer, line string) {
	var b strings.Builder
	for _, r := range line {
		if unicode.IsControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

// maxDomainXML bounds the domain XML the hook reads.
const maxDomainXML = 16 << 20

// hookAgentTimeout bounds the hook's question to the agent (libvirtd
// waits for the hook).
const hookAgentTimeout = 10 * time.Second

// runningDomains reads the names, UUIDs and vNIC counts (interfaces other
// than hostdev) of the running QEMU domains
// from libvirt's status files (DIR/NAME.xml, a <domstatus> holding the
// live <domain>), which libvirt keeps while a domain runs.
func runningDomains(dir string) ([]admit.Domain, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.xml"))
	if err != nil {
		return nil, err
	}
	var out []admit.Domain
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // stopped meanwhile
		}
		var st struct {
			Domain struct {
				Name    string `xml:"name"`
				UUID    string `xml:"uuid"`
				Devices struct {
					Interfaces []struct {
						Type string `xml:"type,attr"`
					} `xml:"interface"`
				} `xml:"devices"`
			} `xml:"domain"`
		}
		if err := xml.Unmarshal(b, &st); err != nil || st.Domain.Name == "" {
			continue
		}
		d := admit.Domain{Name: st.Domain.Name, UUID: strings.ToLower(st.Domain.UUID)}
		for _, i := range st.Domain.Devices.Interfaces {
			if i.Type != "hostdev" {
				d.VNICs++
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// hookScript is the hook libvirtd runs. On `prepare begin` it keeps the
// domain XML in a temporary file so that sluice and the chained hook both
// read it; anything else goes to the chained hook alone. Without the
// sluice binary it lets domains start (a removed sluice must not stop
// every VM of the host).
func hookScript(sluice, policyFile, host, sock, unreachable, chained string) string {
	return `#!/bin/sh
` + hookMarker + ` (sluice hook install); 'sluice hook uninstall' removes it.
SLUICE=` + shQuote(sluice) + `
POLICY=` + shQuote(policyFile) + `
HOST=` + shQuote(host) + `
AGENT=` + shQuote(sock) + `
UNREACHABLE=` + shQuote(unreachable) + `
CHAINED=` + shQuote(chained) + `
if [ "$2" = prepare ] && [ "$3" = begin ]; then
	tmp=$(mktemp) || exit 1
	trap 'rm -f "$tmp"' EXIT
	cat > "$tmp"
	if [ -x "$SLUICE" ]; then
		"$SLUICE" hook qemu --policy "$POLICY" --host "$HOST" --agent "$AGENT" --unreachable "$UNREACHABLE" -- "$@" < "$tmp" || exit 1
	elif [ "$UNREACHABLE" = open ]; then
		echo "sluice: $SLUICE is missing; $1 starts without an admission check" >&2
	else
		echo "sluice: refused $1: $SLUICE is missing and the hook fails closed" >&2
		exit 1
	fi
	if [ -x "$CHAINED" ]; then
		"$CHAINED" "$@" < "$tmp" || exit $?
	fi
	exit 0
fi
if [ -x "$CHAINED" ]; then
	exec "$CHAINED" "$@"
fi
exit 0
`
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func isSluiceHook(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), hookMarker)
}

func runHookInstall(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("hook install")
	file := fs.String("policy", "", "policy file: decides when the agent does not answer")
	host := fs.String("host", "", "this host's name in the policy (default: the hostname)")
	sock := fs.String("agent", "", "the agent's admission socket (default: "+agent.AdmitSocket(lab.DefaultStateDir, "HOST")+")")
	unreachable := fs.String("unreachable", "closed", "when neither the agent nor the policy file can decide: closed (refuse) or open (admit)")
	dir := fs.String("hooks-dir", defaultHooksDir, "libvirt's hooks directory")
	exe := fs.String("sluice", "", "the sluice binary the hook runs (default: this one)")
	noReload := fs.Bool("no-reload", false, "do not signal libvirtd (it sees a new hook only after SIGHUP or a restart)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || (*unreachable != "closed" && *unreachable != "open") {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		fmt.Fprintln(stderr, hookUsage)
		return exitUsage
	}
	if *host == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintf(stderr, "sluice hook install: %v (give --host)\n", err)
			return exitBad
		}
		*host = h
	}
	abs := ""
	if *file != "" {
		p, code := loadPolicy(*file, stderr)
		if p == nil {
			return code
		}
		if p.Host(*host) == nil {
			fmt.Fprintf(stderr, "sluice hook install: host %q is not in %s (give --host)\n", *host, *file)
			return exitBad
		}
		var err error
		if abs, err = filepath.Abs(*file); err != nil {
			fmt.Fprintf(stderr, "sluice hook install: %v\n", err)
			return exitBad
		}
	}
	if *sock == "" {
		*sock = agent.AdmitSocket(lab.DefaultStateDir, *host)
	}
	var err error
	bin := *exe
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			fmt.Fprintf(stderr, "sluice hook install: %v (give --sluice)\n", err)
			return exitBad
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "sluice hook install: %v\n", err)
		return exitBad
	}
	hook := filepath.Join(*dir, "qemu")
	chained := hook + chainedSuffix
	if _, err := os.Stat(hook); err == nil && !isSluiceHook(hook) {
		if _, err := os.Stat(chained); err == nil {
			fmt.Fprintf(stderr, "sluice hook install: %s exists and so does %s; move one away first\n", hook, chained)
			return exitBad
		}
		if err := os.Rename(hook, chained); err != nil {
			fmt.Fprintf(stderr, "sluice hook install: %v\n", err)
			return exitBad
		}
		fmt.Fprintf(stdout, "%s: the existing hook is kept as %s and runs after sluice admits\n", hook, chained)
	}
	tmp := hook + ".sluice-tmp"
	if err := os.WriteFile(tmp, []byte(hookScript(bin, abs, *host, *sock, *unreachable, chained)), 0o755); err != nil {
		fmt.Fprintf(stderr, "sluice hook install: %v\n", err)
		return exitBad
	}
	if err := os.Rename(tmp, hook); err != nil {
		fmt.Fprintf(stderr, "sluice hook install: %v\n", err)
		return exitBad
	}
	by := "its agent (" + *sock + ")"
	if abs != "" {
		by += ", else " + abs
	}
	fmt.Fprintf(stdout, "%s: sluice admits domains on host %s by %s; when neither answers, fails %s\n", hook, *host, by, *unreachable)
	if !*noReload {
		fmt.Fprintln(stdout, reloadLibvirtd())
	}
	return exitOK
}

func runHookUninstall(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("hook uninstall")
	dir := fs.String("hooks-dir", defaultHooksDir, "libvirt's hooks directory")
	noReload := fs.Bool("no-reload", false, "do not signal libvirtd")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		if err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		fmt.Fprintln(stderr, hookUsage)
		return exitUsage
	}
	hook := filepath.Join(*dir, "qemu")
	chained := hook + chainedSuffix
	if !isSluiceHook(hook) {
		fmt.Fprintf(stdout, "%s: no sluice hook, nothing to remove\n", hook)
		return exitOK
	}
	if err := os.Remove(hook); err != nil {
		fmt.Fprintf(stderr, "sluice hook uninstall: %v\n", err)
		return exitBad
	}
	fmt.Fprintf(stdout, "%s: sluice hook removed\n", hook)
	if _, err := os.Stat(chained); err == nil {
		if err := os.Rename(chained, hook); err != nil {
			fmt.Fprintf(stderr, "sluice hook uninstall: restoring %s: %v\n", chained, err)
			return exitBad
		}
		fmt.Fprintf(stdout, "%s: the hook that was there before is back\n", hook)
	}
	if !*noReload {
		fmt.Fprintln(stdout, reloadLibvirtd())
	}
	return exitOK
}

// reloadLibvirtd sends SIGHUP to libvirtd (or virtqemud), which makes it
// look for hook scripts again (measured with libvirt 9.0: a hook written
// while libvirtd runs is not run before that).
func reloadLibvirtd() string {
	var errs []error
	for _, pf := range []string{"/run/libvirtd.pid", "/run/libvirt/virtqemud.pid", "/run/virtqemud.pid"} {
		b, err := os.ReadFile(pf)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			errs = append(errs, fmt.Errorf("%s (pid %d): %w", pf, pid, err))
			continue
		}
		return fmt.Sprintf("libvirtd (pid %d) signalled (SIGHUP) to load the hook", pid)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Sprintf("could not signal libvirtd (%v): run 'systemctl reload libvirtd' (or restart it) for the hook to take effect", err)
	}
	return "libvirtd not found running: it loads the hook when it starts ('systemctl reload libvirtd' if it runs)"
}
