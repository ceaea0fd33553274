package virt

import (
	"fmt"
	"sort"
	"strings"
)

// Uplinks is the flag value of `--uplink NAME=DEVICE` (repeated, or
// comma-separated): the policy's uplink names mapped to the host's own
// devices, for Config.Uplinks. It implements flag.Value.
type Uplinks map[string]string

// Set adds NAME=DEVICE pairs; a name given twice is an error.
func (u *Uplinks) Set(s string) error {
	if *u == nil {
		*u = Uplinks{}
	}
	for _, p := range strings.Split(s, ",") {
		name, dev, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || name == "" || dev == "" {
			return fmt.Errorf("uplink %q: want NAME=DEVICE, e.g. vmnic0=bond0", p)
		}
		if len(dev) > 15 || strings.ContainsAny(dev, "/ \t") {
			return fmt.Errorf("uplink %s: %q is not a network device name", name, dev)
		}
		if old, dup := (*u)[name]; dup {
			return fmt.Errorf("uplink %s given twice (%s and %s)", name, old, dev)
		}
		(*u)[name] = dev
	}
	return nil
}

// String renders NAME=DEVICE pairs sorted by name.
func (u *Uplinks) String() string {
	if u == nil {
		return ""
	}
	var ps []string
	for n, d := range *u {
		ps = append(ps, n+"="+d)
	}
	sort.Strings(ps)
	return strings.Join(ps, ",")
}
