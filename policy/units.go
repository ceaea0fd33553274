package policy

import (
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Bounds on values, so that sums of many values cannot overflow int64 and
// absurd inputs are reported instead of silently wrapping.
const (
	MaxRate     Bps   = 100_000_000_000_000 // 100 Tbps
	MaxIOPS     IOPS  = 1_000_000_000
	MaxBytes    Bytes = 1 << 60 // 1 EiB
	MaxDuration       = time.Hour
	MaxShares         = 1_000_000
)

var rateUnits = map[string]int64{"bps": 1, "Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9, "Tbps": 1e12}
var rateUnitNames = []string{"bps", "Kbps", "Mbps", "Gbps", "Tbps"}

var sizeUnits = map[string]int64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
var sizeUnitNames = []string{"B", "KiB", "MiB", "GiB", "TiB"}

var durUnits = map[string]int64{"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
var durUnitNames = []string{"ns", "us", "ms", "s"}

// quantityRE is a non-negative decimal number followed by an optional unit.
var quantityRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]\+?([0-9]{1,2}))? *([A-Za-zµ/]*)$`)

// parseQuantity parses "NUMBER UNIT" with the given unit table. A bare 0
// needs no unit. It returns the value in base units, rounded to the nearest
// integer, or a message saying what is wrong.
func parseQuantity(s string, units map[string]int64, names []string, max int64, what string) (int64, string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Sprintf("empty %s (want e.g. 10%s)", what, names[len(names)-2])
	}
	if len(s) > MaxQuantityLen {
		return 0, tooLong(s, "a "+what)
	}
	if strings.HasPrefix(s, "-") {
		return 0, "must not be negative"
	}
	m := quantityRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Sprintf("cannot parse %q as a %s (want a number and a unit: %s)", clip(s), what, strings.Join(names, ", "))
	}
	num, exp, unit := m[1], m[2], m[3]
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Sprintf("cannot parse %q as a %s", clip(s), what)
	}
	if exp != "" {
		e, _ := strconv.Atoi(exp)
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(e)), nil)))
	}
	if unit == "" {
		if r.Sign() == 0 {
			return 0, ""
		}
		return 0, fmt.Sprintf("%q has no unit (want one of %s)", clip(s), strings.Join(names, ", "))
	}
	mult, ok := units[unit]
	if !ok {
		return 0, fmt.Sprintf("unknown unit %q in %q (want one of %s)%s", clip(unit), clip(s), strings.Join(names, ", "), suggestUnit(unit, names))
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	// Round half up to an integer number of base units.
	r.Add(r, big.NewRat(1, 2))
	q := new(big.Int).Quo(r.Num(), r.Denom())
	if !q.IsInt64() || q.Int64() > max {
		return 0, fmt.Sprintf("%q is too large (at most %s)", clip(s), formatMax(max, units, names))
	}
	return q.Int64(), ""
}

// suggestUnit proposes the unit meant: a decimal size unit (GB) means the
// binary one (GiB); an abbreviation (G, Gb) means the unit it starts;
// otherwise the nearest by spelling.
func suggestUnit(unit string, names []string) string {
	if len(unit) == 2 && unit[1] == 'B' {
		for _, n := range names {
			if n == unit[:1]+"iB" {
				return fmt.Sprintf(" (did you mean %q? sizes are binary)", n)
			}
		}
	}
	if len(unit) <= 3 {
		for _, n := range names {
			if len(n) > len(unit) && strings.EqualFold(n[:len(unit)], unit) {
				return fmt.Sprintf(" (did you mean %q?)", n)
			}
		}
	}
	return suggest(unit, names)
}

func formatMax(max int64, units map[string]int64, names []string) string {
	u := names[len(names)-1]
	return strconv.FormatInt(max/units[u], 10) + u
}

// ParseRate parses a rate such as "9.4Gbps" (decimal, bits per second).
func ParseRate(s string) (Bps, error) {
	v, msg := parseQuantity(s, rateUnits, rateUnitNames, int64(MaxRate), "rate")
	if msg != "" {
		return 0, fmt.Errorf("%s", msg)
	}
	return Bps(v), nil
}

// ParseSize parses a size such as "256GiB" (binary units).
func ParseSize(s string) (Bytes, error) {
	v, msg := parseQuantity(s, sizeUnits, sizeUnitNames, int64(MaxBytes), "size")
	if msg != "" {
		return 0, fmt.Errorf("%s", msg)
	}
	return Bytes(v), nil
}

// ParseDuration parses a duration such as "12ms" (units ns, us, ms, s).
func ParseDuration(s string) (time.Duration, error) {
	v, msg := parseQuantity(s, durUnits, durUnitNames, int64(MaxDuration), "duration")
	if msg != "" {
		return 0, fmt.Errorf("%s", msg)
	}
	return time.Duration(v), nil
}

// FormatRate renders a rate with the largest unit that keeps it readable,
// e.g. 9400000000 → "9.4Gbps"; Unlimited → "unlimited".
func FormatRate(r Bps) string {
	if r == Unlimited {
		return "unlimited"
	}
	for i := len(rateUnitNames) - 1; i > 0; i-- {
		u := rateUnitNames[i]
		if m := rateUnits[u]; int64(r) >= m {
			return strconv.FormatFloat(float64(r)/float64(m), 'f', -1, 64) + u
		}
	}
	return strconv.FormatInt(int64(r), 10) + "bps"
}

// shareKeywords maps the keywords of each resource to their values.
var shareKeywords = map[string]map[string]int{
	"network": {"low": NetSharesLow, "normal": NetSharesNormal, "high": NetSharesHigh},
	"storage": {"low": StorageSharesLow, "normal": StorageSharesNormal, "high": StorageSharesHigh},
	"cpu":     {"low": CPUSharesLow, "normal": CPUSharesNormal, "high": CPUSharesHigh},
}

// ParseShares parses shares of resource ("network", "storage", "cpu"):
// a keyword (its value times mult: a VM's CPU keyword counts per vCPU) or
// a positive integer.
func ParseShares(s, resource string, mult int) (int, error) {
	v, msg := parseShares(s, resource)
	if msg != "" {
		return 0, errors.New(msg)
	}
	if _, kw := shareKeywords[resource][strings.TrimSpace(s)]; kw {
		v *= mult
	}
	return v, nil
}

// parseShares parses a share keyword of the resource ("network",
// "storage", "cpu") or a positive integer.
func parseShares(s, resource string) (int, string) {
	s = strings.TrimSpace(s)
	if len(s) > MaxQuantityLen {
		return 0, tooLong(s, "shares")
	}
	if v, ok := shareKeywords[resource][s]; ok {
		return v, ""
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil || strings.Trim(s, "-+0123456789") == "" && s != "" {
		if err != nil || n > MaxShares {
			return 0, fmt.Sprintf("%s shares %q out of range (1..%d)", resource, clip(s), MaxShares)
		}
		if n <= 0 {
			return 0, fmt.Sprintf("shares must be positive, got %d", n)
		}
		return int(n), ""
	}
	return 0, fmt.Sprintf("cannot parse %q as shares (want low, normal, high or a positive integer)%s", clip(s), suggest(s, []string{"low", "normal", "high"}))
}

// parseIOPS parses a non-negative integer number of I/Os per second,
// optionally followed by "IOPS".
func parseIOPS(s string) (IOPS, string) {
	t := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "IOPS"))
	if len(t) > MaxQuantityLen {
		return 0, tooLong(s, "IOPS")
	}
	if strings.HasPrefix(t, "-") {
		return 0, "must not be negative"
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		if strings.Trim(t, "+0123456789") == "" && t != "" {
			return 0, fmt.Sprintf("%q is too large (at most %d)", clip(s), MaxIOPS)
		}
		return 0, fmt.Sprintf("cannot parse %q as IOPS (want a non-negative integer)", clip(s))
	}
	if IOPS(n) > MaxIOPS {
		return 0, fmt.Sprintf("%q is too large (at most %d)", clip(s), MaxIOPS)
	}
	return IOPS(n), ""
}

// tooLong is the message for a number longer than MaxQuantityLen.
func tooLong(s, what string) string {
	return fmt.Sprintf("%q is too long for %s (%d characters, at most %d)", clip(s), what, len(s), MaxQuantityLen)
}

// clip shortens s for inclusion in a one-line message.
func clip(s string) string {
	const max = 40
	if len(s) > 4*max {
		s = s[:4*max] // work and memory bounded by the message, not the input
	}
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) > max {
		r := []rune(s)
		if len(r) > max {
			return string(r[:max]) + "…"
		}
	}
	return s
}

// formatSize renders a size with the largest binary unit that divides it.
func formatSize(b Bytes) string {
	for i := len(sizeUnitNames) - 1; i > 0; i-- {
		u := sizeUnitNames[i]
		if m := sizeUnits[u]; int64(b) >= m && int64(b)%m == 0 {
			return strconv.FormatInt(int64(b)/m, 10) + u
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
