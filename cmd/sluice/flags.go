package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"sluice/policy"
)

// flagSetHook, when set (tests), sees every flag set a command makes.
var flagSetHook func(*flag.FlagSet)

// newFlagSet is the flag set of command name ("agent", "agent status"):
// errors are returned, not printed (flagError words them).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if flagSetHook != nil {
		flagSetHook(fs)
	}
	return fs
}

// flagError words an error of fs.Parse the one way every command words a
// bad flag: `sluice CMD: unknown flag --x (did you mean "--y"?); see
// 'sluice CMD --help'`.
func flagError(fs *flag.FlagSet, err error) string {
	var known []string
	fs.VisitAll(func(f *flag.Flag) { known = append(known, dashes(f.Name)) })
	msg := err.Error()
	switch {
	case errors.Is(err, flag.ErrHelp):
		msg = "-h is --help"
	case strings.HasPrefix(msg, "flag provided but not defined: "):
		return unknownFlag(fs.Name(), strings.TrimPrefix(msg, "flag provided but not defined: "), known)
	case strings.HasPrefix(msg, "flag needs an argument: "):
		msg = fmt.Sprintf("flag %s needs a value", dashes(strings.TrimLeft(strings.TrimPrefix(msg, "flag needs an argument: "), "-")))
	default:
		// invalid value "x" for flag -name: reason
		if v, rest, ok := strings.Cut(msg, " for flag -"); ok {
			name, reason, _ := strings.Cut(rest, ": ")
			msg = fmt.Sprintf("%s for %s: %s", v, dashes(name), reason)
		}
	}
	return fmt.Sprintf("sluice %s: %s; see 'sluice %s --help'", fs.Name(), msg, fs.Name())
}

// unknownFlag is the line of an unknown flag of command cmd, with the
// nearest of known (spelled as in the help: --name, -o) when it is a
// likely typo.
func unknownFlag(cmd, name string, known []string) string {
	if !strings.HasPrefix(name, "-") {
		name = "-" + name
	}
	bare := strings.TrimLeft(name, "-")
	if v, _, ok := strings.Cut(bare, "="); ok {
		bare = v
	}
	return fmt.Sprintf("sluice %s: unknown flag %s%s; see 'sluice %s --help'", cmd, dashes(bare), policy.Suggest(dashes(bare), known), cmd)
}

// dashes spells a flag as the help does: -o for one letter, --name else.
func dashes(name string) string {
	name = strings.TrimLeft(name, "-")
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}
