package policy

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one problem found in a policy file, reported as
// `FILE:LINE: FIELD: MSG`. Field is the path of the offending field (see
// docs/policy.md, "Field paths"), for example `vms[vm1].nics[nic0].reservation`
// or `hosts[h1].uplinks[vmnic0].speed`; it is empty for problems of the file as
// a whole (empty file, YAML syntax error). Line is 1-based.
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error formats e as one line.
func (e Error) Error() string {
	line := e.Line
	if line < 1 {
		line = 1
	}
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, line, e.Field, e.Msg)
}

// Errors is every problem found in one file, in line order. Parse and Load
// return it (as error) when the file is not valid.
type Errors []Error

// Error joins the problems, one per line, without a trailing newline.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// sortByLine orders the problems by line, keeping the order of discovery
// among problems of the same line.
func (es Errors) sortByLine() {
	sort.SliceStable(es, func(i, j int) bool { return es[i].Line < es[j].Line })
}

// MaxErrors is how many problems one run reports at most; the last line
// then says how many more there are.
const MaxErrors = 100

// capped keeps the first MaxErrors problems and a last line counting the
// rest of them plus dropped (problems counted but not recorded).
func (es Errors) capped(dropped int) Errors {
	if len(es) <= MaxErrors {
		return es
	}
	rest := es[MaxErrors]
	out := append(Errors(nil), es[:MaxErrors]...)
	return append(out, Error{File: rest.File, Line: rest.Line, Msg: fmt.Sprintf("%d more problems not shown", len(es)-MaxErrors+dropped)})
}

// errorList collects problems for one file. Past 10 × MaxErrors it only
// counts them, so that a file of a million typos costs no more than reading it.
type errorList struct {
	file    string
	errs    Errors
	dropped int
}

// full reports whether further problems are only counted.
func (l *errorList) full() bool { return len(l.errs) >= 10*MaxErrors }

func (l *errorList) add(line int, field, format string, args ...any) {
	if l.full() {
		l.dropped++
		return
	}
	l.errs = append(l.errs, Error{File: l.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// result is the collected problems in line order, capped at MaxErrors.
func (l *errorList) result() Errors {
	l.errs.sortByLine()
	return l.errs.capped(l.dropped)
}

// suggest returns ` (did you mean "x"?)` for the candidate nearest to s, or
// "" when none is near enough to be a likely typo.
func suggest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	ls := strings.ToLower(s)
	for _, c := range candidates {
		d := editDistance(ls, strings.ToLower(c))
		if d < bestD {
			best, bestD = c, d
		}
	}
	limit := 2
	if len(s) >= 9 {
		limit = 3
	}
	if best == "" || bestD > limit || bestD >= len(s) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance of a and b (with adjacent
// transpositions counting as one edit). Inputs are short keys.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 20
	}
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
