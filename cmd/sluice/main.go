// Command sluice is the one binary of sluice: I/O resource control for
// clusters of Linux virtualization hosts. Each subcommand lives in its own
// file and registers itself in init (DESIGN.md §5).
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes (DESIGN.md §5).
const (
	exitOK    = 0
	exitBad   = 1 // bad input, failed expectation
	exitUsage = 2 // usage error
)

// command is one subcommand.
type command struct {
	name    string
	summary string // one line for the help text
	// run executes the command with its arguments (after the name) and
	// returns the exit code. It writes errors itself, one line each.
	run func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

// register adds a subcommand; called from init in the command's file.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("sluice: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice COMMAND [ARGS]   (sluice COMMAND --help: its usage and an example)")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run runs the command line args and returns the exit code. A panic
// (a bug: every input is meant to get a message of its own) becomes one
// line and exit 1, never a stack trace.
func run(args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			msg := strings.Join(strings.Fields(fmt.Sprint(r)), " ")
			if len(msg) > 200 {
				msg = msg[:200] + "…"
			}
			fmt.Fprintf(stderr, "sluice: internal error: %s\n", msg)
			code = exitBad
		}
	}()
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(stdout)
		return exitOK
	case "help":
		if len(args) > 1 && printHelp(stdout, args[1], args[2:]) {
			return exitOK
		}
		usage(stdout)
		return exitOK
	case "--version", "-version":
		args = []string{"version"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q (run 'sluice help')\n", args[0])
		return exitUsage
	}
	if wantsHelp(args[1:]) && printHelp(stdout, args[0], args[1:]) {
		return exitOK
	}
	return c.run(args[1:], stdout, stderr)
}
