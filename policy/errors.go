package policy

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
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

// MaxErrors is how many problems one run reports at most; the last line
// then says how many more there are.
const MaxErrors = 100

// errorList collects problems for one file. Past 10 × MaxErrors it only
// counts them, so that a file of a million typos costs no more than reading
// it. A problem's hint ("did you mean") is computed only if the problem is
// among the MaxErrors reported.
type errorList struct {
	file    string
	errs    Errors
	hints   []func() string // hints[i] completes errs[i].Msg; nil: none
	dropped int
}

// full reports whether further problems are only counted.
func (l *errorList) full() bool { return len(l.errs) >= 10*MaxErrors }

func (l *errorList) add(line int, field, format string, args ...any) {
	l.addHint(nil, line, field, format, args...)
}

// addHint records a problem whose message is completed by hint() when it
// is reported.
func (l *errorList) addHint(hint func() string, line int, field, format string, args ...any) {
	if l.full() {
		l.dropped++
		return
	}
	l.errs = append(l.errs, Error{File: l.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
	l.hints = append(l.hints, hint)
}

// result is the collected problems in line order (order of discovery
// within a line), at most MaxErrors of them and then a line counting the
// rest.
func (l *errorList) result() Errors {
	idx := make([]int, len(l.errs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return l.errs[idx[a]].Line < l.errs[idx[b]].Line })
	n := min(len(idx), MaxErrors)
	out := make(Errors, 0, n+1)
	for _, i := range idx[:n] {
		e := l.errs[i]
		if h := l.hints[i]; h != nil {
			e.Msg += h()
		}
		out = append(out, e)
	}
	if more := len(idx) - n + l.dropped; more > 0 {
		rest := l.file
		line := 0
		if n < len(idx) {
			line = l.errs[idx[n]].Line
		}
		out = append(out, Error{File: rest, Line: line, Msg: fmt.Sprintf("%d more problems not shown", more)})
	}
	return out
}

// Bounds on the work of one suggestion: candidates beyond the first
// maxSuggestCandidates are not considered, nor strings longer than 64 bytes.
const maxSuggestCandidates = 1000

// suggest returns ` (did you mean "x"?)` for the candidate nearest to s, or
// "" when none is near enough to be a likely typo.
func suggest(s string, candidates []string) string {
	if len(s) > 64 {
		return ""
	}
	limit := 2
	if len(s) >= 9 {
		limit = 3
	}
	n := utf8.RuneCountInString(s)
	ls := strings.ToLower(s)
	best, bestD := "", limit+1
	for i, c := range candidates {
		if i == maxSuggestCandidates {
			break
		}
		if m := utf8.RuneCountInString(c); m > n+limit || m < n-limit {
			continue // the distance is at least the difference in length
		}
		if d := editDistance(ls, strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD >= len(s) {
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

// Suggest returns ` (did you mean "x"?)` for the candidate nearest to s
// (a likely typo of it), or "": the hint of policy errors, for other
// names (a command line's flags).
func Suggest(s string, candidates []string) string { return suggest(s, candidates) }
