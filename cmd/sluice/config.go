package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"sluice/policy"
)

// configDir is where the daemons' config files are looked for by default
// (/etc/sluice/agent.yaml, gateway.yaml, controller.yaml).
var configDir = "/etc/sluice"

// configFlag is a daemon's --config: a YAML file of its flags, one key
// per flag without dashes (`host: pve1`, `uplink: [vmnic0=bond0]`, `cpu:
// true`), that sets every flag the command line does not. Without
// --config the file configDir/NAME.yaml is read when it exists.
type configFlag struct {
	path *string
	def  string
}

// addConfigFlag registers --config on fs for daemon name.
func addConfigFlag(fs *flag.FlagSet, name string) *configFlag {
	c := &configFlag{def: configDir + "/" + name + ".yaml"}
	c.path = fs.String("config", "", "YAML file of flags (key: value, a list for a repeated flag); the command line wins (default "+c.def+" when it exists)")
	return c
}

// apply sets, after fs.Parse, the flags the file gives and the command
// line does not; keys that are flags of also (the daemon's, in the file
// of `agent uninstall`) but not of fs are passed over. Errors are one
// line: FILE:LINE: what.
func (c *configFlag) apply(fs *flag.FlagSet, also *flag.FlagSet) error {
	path := *c.path
	b, err := os.ReadFile(path)
	if path == "" {
		path = c.def
		if b, err = os.ReadFile(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return nil // an empty file
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want flag: value lines", path, m.Line)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var known []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" {
			known = append(known, f.Name)
		}
	})
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		name := strings.TrimLeft(k.Value, "-")
		f := fs.Lookup(name)
		if f == nil && also != nil && also.Lookup(name) != nil {
			continue
		}
		if f == nil || name == "config" {
			return fmt.Errorf("%s:%d: %s: not a flag of sluice %s%s", path, k.Line, k.Value, fs.Name(), policy.Suggest(name, known))
		}
		if set[name] {
			continue // the command line wins
		}
		var vals []*yaml.Node
		switch v.Kind {
		case yaml.ScalarNode:
			vals = []*yaml.Node{v}
		case yaml.SequenceNode:
			vals = v.Content
		default:
			return fmt.Errorf("%s:%d: %s: want a value or a list of values", path, v.Line, name)
		}
		for _, x := range vals {
			if x.Kind != yaml.ScalarNode {
				return fmt.Errorf("%s:%d: %s: want a value", path, x.Line, name)
			}
			if err := fs.Set(name, x.Value); err != nil {
				return fmt.Errorf("%s:%d: %s: %v", path, x.Line, name, err)
			}
		}
	}
	return nil
}
