package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

func init() {
	register(command{name: "completion", summary: "shell completion script: bash or zsh", run: runCompletion})
	helps["completion"] = `usage: sluice completion bash|zsh

Print a completion script for bash or zsh: commands, their verbs and
every flag of each (from the flag sets the commands parse, the same the
--help test checks). Load it in the current shell, or install it:

  source <(sluice completion bash)
  sluice completion bash | sudo tee /usr/share/bash-completion/completions/sluice
  sluice completion zsh > "${fpath[1]}/_sluice"

example:
  sluice completion bash`
}

// commandVerbs are the verbs of the commands that have them, for
// completion (each verb's flags are commandFlags' "CMD VERB").
var commandVerbs = map[string][]string{
	"agent":     {"status", "uninstall"},
	"gateway":   {"status", "disk-xml"},
	"hook":      {"install", "uninstall", "qemu"},
	"lab":       {"up", "down", "status"},
	"datastore": {"create"},
	"ctl":       {"apply", "get", "set", "what-if", "explain", "power-on", "migrate", "approve"},
}

// commandFlags returns every command's flags as its help spells them
// (--name, -x), keyed by "CMD" or "CMD VERB": each command that parses a
// flag set is run with a flag it does not have (it stops at the parse,
// before doing anything) and its flag set read; the hand-parsed ones give
// their lists.
func commandFlags() map[string][]string {
	var sets []*flag.FlagSet
	flagSetHook = func(fs *flag.FlagSet) { sets = append(sets, fs) }
	for _, args := range [][]string{
		{"agent"}, {"agent", "status"}, {"agent", "uninstall"}, {"controller"}, {"datastore", "create"},
		{"gateway"}, {"gateway", "status"}, {"gateway", "disk-xml"}, {"hook", "qemu"}, {"hook", "install"},
		{"hook", "uninstall"}, {"lab", "up"}, {"lab", "down"}, {"lab", "status"}, {"sim"}, {"top"},
	} {
		run(append(args, "--zz-no-such-flag"), io.Discard, io.Discard)
	}
	flagSetHook = nil
	out := map[string][]string{}
	for _, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) { out[fs.Name()] = append(out[fs.Name()], dashes(f.Name)) })
	}
	out["alloc"] = netFlags
	out["explain"] = []string{"--demand", "--unnamed", "--cpu-mhz-per-gbps"}
	out["place"] = placeFlags
	out["ctl"] = ctlFlags
	for k := range out {
		sort.Strings(out[k])
	}
	return out
}

func runCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprintln(stderr, "sluice completion: want bash or zsh; see 'sluice completion --help'")
		return exitUsage
	}
	flags := commandFlags()
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	if args[0] == "zsh" {
		b.WriteString("#compdef sluice\n# sluice completion for zsh (bash's, through bashcompinit).\nautoload -U +X bashcompinit && bashcompinit\n")
	} else {
		b.WriteString("# sluice completion for bash: source <(sluice completion bash)\n")
	}
	b.WriteString(`_sluice() {
	local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} verb=${COMP_WORDS[2]} words=
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "` + strings.Join(names, " ") + `" -- "$cur"))
		return
	fi
	case "$cmd" in
`)
	var cmds []string
	for c := range commandVerbs {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds)
	b.WriteString("\t" + strings.Join(cmds, "|") + ")\n")
	b.WriteString("\t\tif [ \"$COMP_CWORD\" -eq 2 ]; then\n\t\t\tcase \"$cmd\" in\n")
	for _, c := range cmds {
		fmt.Fprintf(&b, "\t\t\t%s) words=%q ;;\n", c, strings.Join(commandVerbs[c], " "))
	}
	b.WriteString("\t\t\tesac\n\t\t\t[[ $cur == -* ]] || { COMPREPLY=($(compgen -W \"$words\" -- \"$cur\")); return; }\n\t\tfi ;;\n\tesac\n")
	b.WriteString("\tcase \"$cmd $verb\" in\n")
	var keys []string
	for k := range flags {
		if strings.Contains(k, " ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\t%q) words=%q ;;\n", k, strings.Join(flags[k], " "))
	}
	b.WriteString("\t*)\n\t\tcase \"$cmd\" in\n")
	keys = keys[:0]
	for k := range flags {
		if !strings.Contains(k, " ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\t\t%s) words=%q ;;\n", k, strings.Join(flags[k], " "))
	}
	b.WriteString("\t\tesac ;;\n\tesac\n")
	b.WriteString(`	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$words" -- "$cur"))
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -o filenames -F _sluice sluice
`)
	fmt.Fprint(stdout, b.String())
	return exitOK
}
