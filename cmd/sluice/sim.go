package main

import (
	"fmt"
	"io"

	"sluice/sim"
)

func init() {
	register(command{name: "sim", summary: "run a simulation scenario (time series, summary, plots)", run: runSim})
}

// runSim is `sluice sim SCENARIO [-o DIR] [-q] [--live FILE]`: exit 1 when the scenario is bad
// or an expectation fails, 2 on usage errors.
func runSim(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sim")
	out := fs.String("o", "", "directory for CSV series, summary.{json,txt} and plots (default: out/sim/NAME)")
	quiet := fs.Bool("q", false, "do not print the summary table")
	live := fs.String("live", "", "live figures (JSON) for the scenario's kind: live expectations")
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			fmt.Fprintln(stderr, flagError(fs, err))
			return exitUsage
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: sluice sim SCENARIO [-o DIR] [-q] [--live FILE]")
		return exitUsage
	}
	sc, err := sim.LoadScenario(pos[0])
	if err != nil {
		// FILE:LINE: field: message, one line per problem.
		fmt.Fprintln(stderr, err)
		return exitBad
	}
	if *live != "" {
		if sc.Live, err = sim.LoadLiveFigures(*live); err != nil {
			fmt.Fprintln(stderr, "sluice sim:", err)
			return exitBad
		}
	}
	res, err := sim.Run(sc)
	if err != nil {
		fmt.Fprintln(stderr, err) // FILE:LINE: field: message
		return exitBad
	}
	dir := *out
	if dir == "" {
		dir = "out/sim/" + sc.Name
	}
	if err := res.Write(dir); err != nil {
		fmt.Fprintln(stderr, "sluice sim:", err)
		return exitBad
	}
	if !*quiet {
		fmt.Fprint(stdout, res.Summary.Text())
	}
	if !res.Summary.Passed {
		return exitBad
	}
	return exitOK
}
