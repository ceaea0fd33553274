package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"sluice/internal/inputfile"
)

// Defaults applied when the file does not say (docs/policy.md).
const (
	DefaultCongestionThreshold = 30 * time.Millisecond
	DefaultControlPeriod       = 4 * time.Second
	DefaultArraySlots          = 8
	DefaultArrayServiceTime    = 5 * time.Millisecond
)

// Load reads, decodes and validates the policy file at path. On a problem
// in the file it returns Errors (every problem, one per line); when the
// file cannot be read (missing, not a regular file, larger than
// MaxFileBytes), an *inputfile.Error: one line `PATH: message`.
func Load(path string) (*Policy, error) {
	data, err := inputfile.Read(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and validates a policy file's contents; file names it in
// messages. It returns Errors listing every problem (decoding, references
// and the admission rules of DESIGN.md §2), or a valid Policy.
func Parse(file string, data []byte) (*Policy, error) {
	p, err := Decode(file, data)
	if err != nil {
		return nil, err
	}
	if errs := p.Admission(); len(errs) > 0 {
		return nil, errs
	}
	return p, nil
}

// Decode decodes a policy file and checks everything but the capacity
// rules: syntax, known fields, units, ranges, R ≤ L, unique names and
// references. Use it for a policy that may knowingly break capacity (a
// fault that placement is to repair); Admission then lists the breaches.
func Decode(file string, data []byte) (p *Policy, err error) {
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, Errors{{File: file, Line: 1, Msg: fmt.Sprintf("internal error while reading the policy: %v", r)}}
		}
	}()
	d := &decoder{errorList{file: file}}
	root := d.parseYAML(data)
	if root == nil {
		return nil, d.errs
	}
	p = d.policy(root)
	p.resolve(&d.errorList)
	if len(d.errs) > 0 {
		return nil, d.result()
	}
	return p, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML checks the raw input and returns the document's root node, or
// nil after recording why there is none.
func (d *decoder) parseYAML(data []byte) *yaml.Node {
	if len(data) > MaxFileBytes {
		d.add(1, "", "larger than %d MiB", MaxFileBytes>>20)
		return nil
	}
	if i := bytes.IndexByte(data, 0); i >= 0 || !utf8.Valid(data) {
		if i < 0 {
			for i = 0; i < len(data); {
				r, n := utf8.DecodeRune(data[i:])
				if r == utf8.RuneError && n <= 1 {
					break
				}
				i += n
			}
		}
		d.add(1+bytes.Count(data[:i], []byte("\n")), "", "not a text file (binary data at byte %d)", i)
		return nil
	}
	if len(bytes.TrimSpace(data)) == 0 {
		d.add(1, "", "empty policy file")
		return nil
	}
	if line, msg := prescan(data); msg != "" {
		d.add(line, "", "%s", msg)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.add(1, "", "empty policy file (only comments)")
		} else {
			d.yamlError(err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.add(extra.Line, "", "more than one YAML document in the file")
		return nil
	} else if !errors.Is(err, io.EOF) {
		d.yamlError(err)
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		d.add(1, "", "empty policy file")
		return nil
	}
	root := doc.Content[0]
	if !d.checkTree(root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		d.add(root.Line, "", "the policy must be a mapping (cluster:, hosts:, vms:, ...), got %s", kindName(root))
		return nil
	}
	return root
}

func (d *decoder) yamlError(err error) {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		d.add(line, "", "syntax error: %s", m[2])
		return
	}
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	d.add(1, "", "syntax error: %s", trimYAMLPrefix(msg))
}

func trimYAMLPrefix(s string) string {
	if len(s) > 6 && s[:6] == "yaml: " {
		return s[6:]
	}
	return s
}

// checkTree refuses aliases (they could expand into huge trees and are
// never needed in a policy), anchors, too-deep nesting and more than
// MaxNodes values. It walks the
// tree without recursion.
func (d *decoder) checkTree(root *yaml.Node) bool {
	type item struct {
		n     *yaml.Node
		depth int
	}
	stack := []item{{root, 1}}
	ok := true
	nodes := 0
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := it.n
		if n.Kind == yaml.AliasNode || n.Anchor != "" {
			d.add(n.Line, "", "YAML anchors and aliases (&, *) are not supported in policy files")
			return false
		}
		if nodes++; nodes > MaxNodes {
			d.add(n.Line, "", "more than %d values (lists and fields): far beyond any cluster", MaxNodes)
			return false
		}
		if it.depth > MaxDepth {
			d.add(n.Line, "", "nesting deeper than %d levels", MaxDepth)
			return false
		}
		for i := len(n.Content) - 1; i >= 0; i-- { // pre-order: first problem in the file first
			stack = append(stack, item{n.Content[i], it.depth + 1})
		}
	}
	return ok
}
