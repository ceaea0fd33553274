package main

import (
	"errors"
	"fmt"
	"io"

	"sluice/policy"
)

// loadPolicy loads and validates the policy file at path. On failure it
// writes every problem to stderr, one line each (`FILE:LINE: field:
// message`), and returns nil and exitBad; commands then return that code.
func loadPolicy(path string, stderr io.Writer) (*policy.Policy, int) {
	p, err := policy.Load(path)
	if err != nil {
		printPolicyError(stderr, err)
		return nil, exitBad
	}
	return p, exitOK
}

// printPolicyError writes err one problem per line: policy.Errors as
// `FILE:LINE: field: message`, any other error as `sluice: message`.
func printPolicyError(w io.Writer, err error) {
	var errs policy.Errors
	if errors.As(err, &errs) {
		for _, e := range errs {
			fmt.Fprintln(w, e.Error())
		}
		return
	}
	fmt.Fprintf(w, "sluice: %v\n", err)
}

// plural renders "1 host" / "2 hosts".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
