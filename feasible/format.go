package feasible

import (
	"math"
	"strconv"
	"strings"
)

// Rate renders bits/s with the largest decimal unit that keeps it at 1 or
// more, exactly: 7.5Gbps, 633.333333Mbps, 0bps.
func Rate(bps int64) string {
	units := [...]struct {
		name string
		v    int64
	}{{"Tbps", 1e12}, {"Gbps", 1e9}, {"Mbps", 1e6}, {"Kbps", 1e3}}
	for _, u := range units {
		if abs(bps) >= u.v {
			return strconv.FormatFloat(float64(bps)/float64(u.v), 'f', -1, 64) + u.name
		}
	}
	return strconv.FormatInt(bps, 10) + "bps"
}

// Size renders bytes with the largest binary unit that keeps it at 1 or
// more, with at most three decimals: 32GiB, 1.5GiB.
func Size(b int64) string {
	units := [...]struct {
		name string
		v    int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if abs(b) >= u.v {
			return trim(float64(b)/float64(u.v)) + u.name
		}
	}
	return strconv.FormatInt(b, 10) + "B"
}

// MHz renders a CPU rate: 10000MHz.
func MHz(m int64) string { return strconv.FormatInt(m, 10) + "MHz" }

// IOPS renders I/O operations per second: 300 IOPS.
func IOPS(x int64) string { return strconv.FormatInt(x, 10) + " IOPS" }

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// trim prints v with at most three decimals and no trailing zeros.
func trim(v float64) string {
	s := strconv.FormatFloat(math.Round(v*1000)/1000, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
