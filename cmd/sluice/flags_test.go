package main

import (
	"bytes"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestHelpListsEveryFlag: every flag of every command (commandFlags: each
// flag set a command makes, and the flags of the commands that parse by
// hand) appears in that command's --help, as --name (or -x for one
// letter), and an unknown flag is a usage error.
func TestHelpListsEveryFlag(t *testing.T) {
	flags := commandFlags()
	for _, c := range []struct {
		cmd string
		err error
	}{
		{"alloc", second(parseNetArgs([]string{"--zz"}))},
		{"place", second(parsePlaceArgs([]string{"--zz"}))},
		{"ctl", second(parseCtlArgs([]string{"--zz"}))},
	} {
		// The hand-parsed commands refuse a flag outside their lists.
		if ue, ok := c.err.(usageError); !ok || ue.flag != "--zz" {
			t.Errorf("%s: --zz gave %v, want an unknown flag", c.cmd, c.err)
		}
	}
	for cmd := range flags {
		var stdout, stderr bytes.Buffer
		if code := run(append(strings.Fields(cmd), "--zz-no-such-flag"), &stdout, &stderr); code != exitUsage {
			t.Errorf("sluice %s --zz-no-such-flag: exit %d, want %d", cmd, code, exitUsage)
		}
	}
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
