package entitle

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"sluice/alloc"
)

// FormatBps renders a rate for people: the largest decimal unit that keeps
// it ≥ 1, at most two decimals, trailing zeros dropped ("8.13Gbps",
// "633.33Mbps", "0bps"); alloc.Inf is "unlimited".
func FormatBps(v float64) string {
	if math.IsInf(v, 1) {
		return "unlimited"
	}
	units := []struct {
		name  string
		scale float64
	}{{"Gbps", 1e9}, {"Mbps", 1e6}, {"Kbps", 1e3}}
	for _, u := range units {
		if math.Abs(v) >= u.scale {
			return trim(v/u.scale) + u.name
		}
	}
	return trim(v) + "bps"
}

// FormatIOPS renders IOPS with at most two decimals; alloc.Inf is
// "unlimited".
func FormatIOPS(v float64) string {
	if math.IsInf(v, 1) {
		return "unlimited"
	}
	return trim(v) + " IOPS"
}

func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// Explain says in words and numbers why the named port (VM/NIC, HOST/CLASS
// or HOST/UPLINK/CLASS) gets what it gets, level by level from its uplink
// down; one string per line. A class on several uplinks is explained on
// each.
func (n *Net) Explain(name string) ([]string, error) {
	ports := n.Port(name)
	if len(ports) == 0 {
		return nil, fmt.Errorf("%s: no such port (ports are VM/NIC of a placed VM, or HOST/CLASS)", name)
	}
	var out []string
	for _, pt := range ports {
		t := pt.Tree
		if t.Spec.Inbound {
			out = append(out, fmt.Sprintf("%s receives on host %s, uplink %s (inbound, usable %s): %s, %s",
				pt.Name, t.Host, t.Uplink, FormatBps(t.CapacityBps), FormatBps(pt.AllocBps()), pt.Node.Reason))
		} else {
			out = append(out, fmt.Sprintf("%s on host %s, uplink %s (usable %s): %s, %s",
				pt.Name, t.Host, t.Uplink, FormatBps(t.CapacityBps), FormatBps(pt.AllocBps()), pt.Node.Reason))
		}
		if pt.Unnamed {
			vm, _, _ := strings.Cut(pt.Name, "/")
			out = append(out, fmt.Sprintf("%s runs on %s but the policy does not name it: each of its vNICs gets the policy's unnamedVMs (reservation %s, shares %s, limit %s)",
				vm, t.Host, FormatBps(pt.ReservationBps()), trim(pt.Node.Shares), FormatBps(pt.LimitBps())))
		}
		root := t.Root
		if root.Alloc < t.CapacityBps {
			out = append(out, fmt.Sprintf("the uplink's ports can use only %s of its %s; that is what it divides", FormatBps(root.Alloc), FormatBps(t.CapacityBps)))
		}
		out = append(out, alloc.Describe(alloc.Explain(pt.Path()), FormatBps)...)
	}
	return out, nil
}

// Explain says why the named disk (VM/DISK) gets what it gets.
func (s *Store) Explain(name string) ([]string, error) {
	d := s.Disk(name)
	if d == nil {
		return nil, fmt.Errorf("%s: no such disk on datastore %s", name, s.Datastore)
	}
	out := []string{fmt.Sprintf("%s on datastore %s (capacity %s): %s, %s",
		name, s.Datastore, FormatIOPS(s.CapacityIOPS), FormatIOPS(d.Node.Alloc), d.Node.Reason)}
	return append(out, alloc.Describe(alloc.Explain(alloc.Find(s.Root, name)), FormatIOPS)...), nil
}
