package policy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// decoder turns the YAML node tree into a Policy, recording every problem.
type decoder struct {
	errorList
}

// mapping is a YAML mapping whose keys have been checked against the known
// field names of its entity.
type mapping struct {
	path   string // field path of the mapping itself ("" at top level)
	line   int
	vals   map[string]*yaml.Node
	keyAt  map[string]int // line of each key
	pos    *Pos           // where field lines are recorded (may be nil)
	prefix string         // prefix of recorded field keys, e.g. "cpu."
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("the value %q", clip(n.Value))
	}
	return "something else"
}

// mapping checks that n is a mapping with only known keys.
func (d *decoder) mapping(n *yaml.Node, path string, pos *Pos, prefix string, known ...string) *mapping {
	if n.Kind != yaml.MappingNode {
		d.add(n.Line, path, "expected a mapping with fields %s, got %s", strings.Join(known, ", "), kindName(n))
		return nil
	}
	m := &mapping{path: path, line: n.Line, vals: map[string]*yaml.Node{}, keyAt: map[string]int{}, pos: pos, prefix: prefix}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" || k.Value == "<<" {
			d.add(k.Line, path, "keys must be plain field names, got %s", kindName(k))
			continue
		}
		key := k.Value
		if prev, dup := m.keyAt[key]; dup {
			d.add(k.Line, join(path, key), "duplicate field (first at line %d)", prev)
			continue
		}
		if !contains(known, key) {
			d.addHint(func() string { return suggestOrList(key, known) }, k.Line, join(path, clip(key)), "unknown field")
			continue
		}
		m.vals[key] = v
		m.keyAt[key] = k.Line
		if pos != nil {
			if pos.Fields == nil {
				pos.Fields = map[string]int{}
			}
			pos.Fields[prefix+key] = v.Line
		}
	}
	return m
}

func suggestOrList(key string, known []string) string {
	if s := suggest(key, known); s != "" {
		return s
	}
	return " (known fields: " + strings.Join(known, ", ") + ")"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// scalar returns the text of the field key, if present and a single value.
func (d *decoder) scalar(m *mapping, key string) (string, int, bool) {
	v, ok := m.vals[key]
	if !ok {
		return "", 0, false
	}
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		d.add(v.Line, join(m.path, key), "expected a single value, got %s", kindName(v))
		return "", v.Line, false
	}
	return v.Value, v.Line, true
}

// nameRE is what names of entities may look like: they appear in port
// names (VM/NIC), namespace names and messages.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func (d *decoder) name(m *mapping, key string, required bool) string {
	s, line, ok := d.scalar(m, key)
	if !ok {
		if required && line == 0 {
			d.add(m.line, join(m.path, key), "missing (required)")
		}
		return ""
	}
	if !nameRE.MatchString(s) {
		d.add(line, join(m.path, key), "invalid name %q (letters, digits, '_', '.', '-'; starting with a letter or digit; at most 63 characters)", clip(s))
		return ""
	}
	return s
}

// rate parses a rate field; it reports whether the field was present and
// valid.
func (d *decoder) rate(m *mapping, key string, dst *Bps, allowUnlimited bool) bool {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return false
	}
	if s == "unlimited" {
		if allowUnlimited {
			*dst = Unlimited
			return true
		}
		d.add(line, join(m.path, key), "`unlimited` is only allowed for limits")
		return false
	}
	v, msg := parseQuantity(s, rateUnits, rateUnitNames, int64(MaxRate), "rate")
	if msg == "" && v == 0 && allowUnlimited {
		msg = ZeroLimitMessage
	}
	if msg != "" {
		d.add(line, join(m.path, key), "%s", msg)
		return false
	}
	*dst = Bps(v)
	return true
}

// ZeroLimitMessage is the error for a limit of 0. sluice has no cap of 0
// (HTB cannot hold a class at 0, and a VM that may not send is a VM to
// stop): a limit is positive or `unlimited`, and a missing limit is
// unlimited.
const ZeroLimitMessage = "a limit must be positive: omit it or write `unlimited` for no limit"

func (d *decoder) size(m *mapping, key string, dst *Bytes) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	v, msg := parseQuantity(s, sizeUnits, sizeUnitNames, int64(MaxBytes), "size")
	if msg != "" {
		d.add(line, join(m.path, key), "%s", msg)
		return
	}
	*dst = Bytes(v)
}

// duration parses a positive duration.
func (d *decoder) duration(m *mapping, key string, dst *time.Duration) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	v, msg := parseQuantity(s, durUnits, durUnitNames, int64(MaxDuration), "duration")
	if msg == "" && v == 0 {
		msg = "must be positive"
	}
	if msg != "" {
		d.add(line, join(m.path, key), "%s", msg)
		return
	}
	*dst = time.Duration(v)
}

// shares parses a share value; keyword values are multiplied by mult
// (vCPUs for CPU shares).
func (d *decoder) shares(m *mapping, key, resource string, mult int, dst *int) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	v, msg := parseShares(s, resource)
	if msg != "" {
		d.add(line, join(m.path, key), "%s", msg)
		return
	}
	if _, kw := shareKeywords[resource][strings.TrimSpace(s)]; kw {
		v *= mult
	}
	*dst = v
}

func (d *decoder) iops(m *mapping, key string, dst *IOPS, allowUnlimited bool) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	if s == "unlimited" {
		if allowUnlimited {
			*dst = UnlimitedIOPS
		} else {
			d.add(line, join(m.path, key), "`unlimited` is only allowed for limits")
		}
		return
	}
	v, msg := parseIOPS(s)
	if msg == "" && v == 0 && allowUnlimited {
		msg = ZeroLimitMessage
	}
	if msg != "" {
		d.add(line, join(m.path, key), "%s", msg)
		return
	}
	*dst = v
}

func (d *decoder) integer(m *mapping, key string, lo, hi int, dst *int) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	if len(s) > MaxQuantityLen {
		d.add(line, join(m.path, key), "%s", tooLong(s, "an integer"))
		return
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		if err != nil && strings.Trim(s, "-+0123456789") != "" {
			d.add(line, join(m.path, key), "cannot parse %q as an integer", clip(s))
		} else {
			d.add(line, join(m.path, key), "%s out of range (%d..%d)", clip(s), lo, hi)
		}
		return
	}
	*dst = int(n)
}

func (d *decoder) boolean(m *mapping, key string, dst *bool) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	switch s {
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		d.add(line, join(m.path, key), "expected true or false, got %q", clip(s))
	}
}

// list returns the items of the list field key (nil when absent or empty,
// or when longer than maxItems allows).
func (d *decoder) list(m *mapping, key string) []*yaml.Node {
	v, ok := m.vals[key]
	if !ok || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		d.add(v.Line, join(m.path, key), "expected a list, got %s", kindName(v))
		return nil
	}
	max, ok := maxItems[key]
	if !ok {
		max = defaultMaxItems
	}
	if len(v.Content) > max {
		d.add(v.Line, join(m.path, key), "%d items, more than the %d a policy may have", len(v.Content), max)
		return nil
	}
	return v.Content
}

// nameList parses a list of names (e.g. a pool's port groups).
func (d *decoder) nameList(m *mapping, key string) ([]string, []int) {
	var names []string
	var lines []int
	for i, n := range d.list(m, key) {
		path := fmt.Sprintf("%s[%d]", join(m.path, key), i)
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || !nameRE.MatchString(n.Value) {
			d.add(n.Line, path, "expected a name, got %s", kindName(n))
			continue
		}
		names = append(names, n.Value)
		lines = append(lines, n.Line)
	}
	return names, lines
}

// itemPath names the i-th item of a list: by its name when it has a valid
// one, else by its 0-based index.
func itemPath(list string, i int, n *yaml.Node) string {
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			k, v := n.Content[j], n.Content[j+1]
			if k.Value == "name" && v.Kind == yaml.ScalarNode && nameRE.MatchString(v.Value) {
				return list + "[" + v.Value + "]"
			}
		}
	}
	return list + "[" + strconv.Itoa(i) + "]"
}
