package policy

import (
	"strconv"

	"sluice/internal/inputfile"
)

// Limits on input, so that no file can exhaust memory or time. Every one
// is far beyond a real cluster (a vSphere cluster has at most 96 hosts and
// 10,000 VMs).
const (
	MaxFileBytes = inputfile.MaxPolicyBytes // larger files are refused unread
	MaxDepth     = 32                       // deepest nesting of lists and mappings accepted
	// MaxNodes is how many YAML values (scalars, lists, mappings) a file
	// may hold. A cheap scan of the text refuses a file that has more
	// before the YAML library builds them. A VM with one vNIC takes at
	// least ten (its mapping, name, host, nics and the vNIC's fields):
	// 500,000 leaves room for the 1,000 hosts and 30,000 VMs of the
	// controller's benchmark (controller.BenchmarkScale).
	MaxNodes = 500_000
	// MaxQuantityLen is the longest number with its unit (a rate, size,
	// duration, IOPS, shares or integer) accepted, in bytes.
	MaxQuantityLen = 64
)

// maxItems caps the length of each list field, by key.
var maxItems = map[string]int{
	"hosts":        1_000,
	"vms":          50_000,
	"datastores":   1_000,
	"portGroups":   10_000,
	"networkPools": 1_000,
	"uplinks":      64,
	"nics":         64,
	"disks":        256,
}

// defaultMaxItems caps any other list.
const defaultMaxItems = 1_000

// prescan bounds the work of parsing data before the YAML library builds
// a tree of it: it counts the YAML indicators that can start a value
// (`- `, `? `, `: `, `,`, `[`, `{`) outside comments and quoted strings,
// at least half the number of values, and the nesting of flow
// lists and mappings. It returns the line and message of the first limit
// crossed, or 0 and "".
func prescan(data []byte) (int, string) {
	const (
		plain = iota
		single
		double
		comment
	)
	state, line, items, flow := plain, 1, 0, 0
	space := func(i int) bool { // data[i] is a separator (or i is past the end)
		return i >= len(data) || data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c == '\n' {
			line++
			if state == comment {
				state = plain
			}
			continue
		}
		switch state {
		case comment:
			continue
		case single:
			if c == '\'' {
				state = plain // '' is an escaped quote: leaving and re-entering is the same
			}
			continue
		case double:
			if c == '\\' {
				i++
				if i < len(data) && data[i] == '\n' {
					line++
				}
			} else if c == '"' {
				state = plain
			}
			continue
		}
		item := false
		switch c {
		case '#':
			if i == 0 || space(i-1) {
				state = comment
			}
		case '\'':
			if i == 0 || space(i-1) || isFlowIndicator(data[i-1]) {
				state = single
			}
		case '"':
			if i == 0 || space(i-1) || isFlowIndicator(data[i-1]) {
				state = double
			}
		case '[', '{':
			item = true
			flow++
			if flow > MaxDepth {
				return line, "nesting deeper than " + strconv.Itoa(MaxDepth) + " levels"
			}
		case ']', '}':
			if flow > 0 {
				flow--
			}
		case ',':
			item = flow > 0
		case '-', '?':
			item = space(i+1) && (i == 0 || space(i-1))
		case ':':
			item = space(i+1) || flow > 0
		}
		if item {
			items++
			if items > MaxNodes {
				return line, "more than " + strconv.Itoa(MaxNodes) + " values (lists and fields): far beyond any cluster"
			}
		}
	}
	return 0, ""
}

func isFlowIndicator(c byte) bool {
	return c == '[' || c == '{' || c == ','
}

// ScanLimits checks data, the text of a YAML file, against MaxFileBytes
// and the limits of the text scan (values, flow nesting) without parsing
// it. Files that embed a policy (scenarios) call it before decoding; it
// returns nil or Errors of one problem.
func ScanLimits(file string, data []byte) error {
	if len(data) > MaxFileBytes {
		return Errors{{File: file, Line: 1, Msg: "larger than " + strconv.Itoa(MaxFileBytes>>20) + " MiB"}}
	}
	if line, msg := prescan(data); msg != "" {
		return Errors{{File: file, Line: line, Msg: msg}}
	}
	return nil
}
