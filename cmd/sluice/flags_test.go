package main

import (
	"bytes"
	"flag"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestHelpListsEveryFlag: every flag of every command (each flag set a
// command makes, and the flags of the commands that parse by hand) appears
// in that command's --help, as --name (or -x for one letter).
func TestHelpListsEveryFlag(t *testing.T) {
	var sets []*flag.FlagSet
	flagSetHook = func(fs *flag.FlagSet) { sets = append(sets, fs) }
	defer func() { flagSetHook = nil }()
	for _, args := range [][]string{
		{"agent"}, {"agent", "status"}, {"agent", "uninstall"}, {"controller"}, {"datastore", "create"},
		{"gateway"}, {"gateway", "status"}, {"gateway", "disk-xml"}, {"hook", "qemu"}, {"hook", "install"},
		{"hook", "uninstall"}, {"lab", "up"}, {"lab", "down"}, {"lab", "status"}, {"sim"}, {"top"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(args, "--zz-no-such-flag"), &stdout, &stderr); code != exitUsage {
			t.Errorf("sluice %s --zz-no-such-flag: exit %d, want %d", strings.Join(args, " "), code, exitUsage)
		}
	}
	flags := map[string][]string{} // command → flags as the help spells them
	for _, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) { flags[fs.Name()] = append(flags[fs.Name()], dashes(f.Name)) })
	}
	for _, c := range []struct {
		cmd string
		err error
	}{
		{"alloc", second(parseNetArgs([]string{"--zz"}))},
		{"explain", second(parseNetArgs([]string{"--zz"}))},
		{"place", second(parsePlaceArgs([]string{"--zz"}))},
		{"ctl", second(parseCtlArgs([]string{"--zz"}))},
	} {
		ue, ok := c.err.(usageError)
		if !ok || len(ue.known) == 0 {
			t.Fatalf("%s: --zz gave %v, want an unknown flag with the known ones", c.cmd, c.err)
		}
		flags[c.cmd] = ue.known
	}
	flags["explain"] = []string{"--demand", "--unnamed", "--cpu-mhz-per-gbps"} // -o: explain prints text only
	if len(flags) < 20 {
		t.Errorf("only %d commands seen: %v", len(flags), flags)
	}
	cmds := make([]string, 0, len(flags))
	for c := range flags {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds)
	for _, cmd := range cmds {
		var stdout, stderr bytes.Buffer
		if code := run(append(strings.Fields(cmd), "--help"), &stdout, &stderr); code != exitOK {
			t.Errorf("sluice %s --help: exit %d %s", cmd, code, stderr.String())
			continue
		}
		help := stdout.String()
		var missing []string
		for _, f := range flags[cmd] {
			if !regexp.MustCompile(`(^|[\s\[(|,'"])` + regexp.QuoteMeta(f) + `($|[\s=\]),|'"])`).MatchString(help) {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			t.Errorf("sluice %s --help does not list %s", cmd, strings.Join(missing, " "))
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestFlagErrors: a bad flag is one line in one style for every command,
// exit 2, with the nearest flag when it is a likely typo.
func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "--hots", "h1"}, `sluice agent: unknown flag --hots (did you mean "--host"?); see 'sluice agent --help'`},
		{[]string{"agent", "uninstall", "--state-dri", "x"}, `sluice agent uninstall: unknown flag --state-dri (did you mean "--state-dir"?); see 'sluice agent uninstall --help'`},
		{[]string{"alloc", "f.yaml", "--demnd", "a/b=1Gbps"}, `sluice alloc: unknown flag --demnd (did you mean "--demand"?); see 'sluice alloc --help'`},
		{[]string{"place", "f.yaml", "--chnage", "x"}, `sluice place: unknown flag --chnage (did you mean "--change"?); see 'sluice place --help'`},
		{[]string{"ctl", "--servr", "x", "get", "hosts"}, `sluice ctl: unknown flag --servr (did you mean "--server"?); see 'sluice ctl --help'`},
		{[]string{"lab", "up", "--stat-dir", "x"}, `sluice lab up: unknown flag --stat-dir (did you mean "--state-dir"?); see 'sluice lab up --help'`},
		{[]string{"gateway", "--bogus"}, `sluice gateway: unknown flag --bogus; see 'sluice gateway --help'`},
		{[]string{"controller", "--listn", "x"}, `sluice controller: unknown flag --listn (did you mean "--listen"?); see 'sluice controller --help'`},
		{[]string{"agent", "--interval"}, `sluice agent: flag --interval needs a value; see 'sluice agent --help'`},
		{[]string{"agent", "--interval", "fast"}, `sluice agent: invalid value "fast" for --interval: parse error; see 'sluice agent --help'`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if got := stderr.String(); code != exitUsage || got != c.want+"\n" {
			t.Errorf("sluice %s: exit %d\n%q\nwant\n%q", strings.Join(c.args, " "), code, got, c.want)
		}
	}
}
