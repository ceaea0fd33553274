package entitle

import (
	"fmt"
	"strings"

	"sluice/alloc"
	"sluice/policy"
)

// AddUnnamed adds to un the vNIC spec, HOST/VM/NIC, of a running VM that
// the policy does not name: to that VM's entry when un has it, else as a
// new one.
func AddUnnamed(un []UnnamedVM, spec string) ([]UnnamedVM, error) {
	f := strings.Split(spec, "/")
	if len(f) != 3 || f[0] == "" || f[1] == "" || f[2] == "" {
		return un, fmt.Errorf("%s: want HOST/VM/NIC, e.g. pve1/web7/vnet3", spec)
	}
	for i := range un {
		if u := &un[i]; u.Host == f[0] && u.Name == f[1] {
			u.NICs = append(u.NICs, f[2])
			return un, nil
		}
	}
	return append(un, UnnamedVM{Name: f[1], Host: f[0], NICs: []string{f[2]}}), nil
}

// ParseDemand parses what a port sends: a rate ("2Gbps") or "unlimited"
// (alloc.Inf).
func ParseDemand(s string) (float64, error) {
	if s == "unlimited" {
		return alloc.Inf, nil
	}
	r, err := policy.ParseRate(s)
	if err != nil {
		return 0, err
	}
	return float64(r), nil
}
