package feasible

import (
	"fmt"
	"math"
	"strconv"
)

// DefaultCap is the fraction of an uplink's speed that class reservations
// may take when none (or one out of (0, 1]) is given.
const DefaultCap = 0.75

// Unlimited is the capacity of a quota that does not bound anything.
const Unlimited int64 = math.MaxInt64

// Classes is what the traffic classes reserve on every uplink, which
// bounds what vNICs may reserve there (DESIGN.md §2).
type Classes struct {
	// Cap is reservationCap, the fraction of an uplink's speed that class
	// reservations may take, in (0, 1]; other values mean DefaultCap.
	Cap float64
	// VMBps is the vm class reservation; 0: the class reserves the sum of
	// its vNICs' reservations on each uplink.
	VMBps int64
	// OtherBps is the sum of the other classes' reservations.
	OtherBps int64
}

func (c Classes) cap() float64 {
	if c.Cap <= 0 || c.Cap > 1 {
		return DefaultCap
	}
	return c.Cap
}

func (c Classes) capText() string { return strconv.FormatFloat(c.cap(), 'f', -1, 64) }

// Reservable is how much of an uplink of speedBps class reservations may
// take: Cap × speed, rounded down to a bit per second.
func (c Classes) Reservable(speedBps int64) int64 {
	return int64(math.Floor(c.cap()*float64(speedBps) + 1e-6))
}

// Budget is what the vNIC reservations on an uplink of speedBps may add
// up to: the vm class reservation when there is one, else what the cap
// leaves after the other classes' reservations; never more than the
// latter, never negative.
func (c Classes) Budget(speedBps int64) int64 {
	left := c.Reservable(speedBps) - c.OtherBps
	if c.VMBps > 0 {
		left = min(c.VMBps, left)
	}
	return max(left, 0)
}

// BudgetWhy says where Budget(speedBps) comes from, for reasons.
func (c Classes) BudgetWhy(speedBps int64) string {
	capped := fmt.Sprintf("reservationCap %s × %s", c.capText(), Rate(speedBps))
	if c.OtherBps > 0 {
		capped += fmt.Sprintf(" − the other classes' %s", Rate(c.OtherBps))
	}
	switch {
	case c.VMBps == 0:
		return capped
	case c.VMBps <= c.Reservable(speedBps)-c.OtherBps:
		return "the vm class reservation"
	default:
		return fmt.Sprintf("the vm class reservation %s, cut to %s", Rate(c.VMBps), capped)
	}
}

// Uplink is an uplink of speedBps with its budget under c.
func (c Classes) Uplink(name string, speedBps int64, down bool) Uplink {
	return Uplink{Name: name, BudgetBps: c.Budget(speedBps), Why: c.BudgetWhy(speedBps), Down: down}
}

// Fit reports whether the class reservations fit on an uplink of
// speedBps, and why not.
func (c Classes) Fit(speedBps int64) (bool, string) {
	total := add(c.OtherBps, c.VMBps)
	if total <= c.Reservable(speedBps) {
		return true, ""
	}
	return false, fmt.Sprintf("traffic class reservations total %s, more than reservationCap %s × %s = %s",
		Rate(total), c.capText(), Rate(speedBps), Rate(c.Reservable(speedBps)))
}

// PoolSpan reports whether a network pool's quota fits in Cap × the
// speeds of the uplinks of the hosts it spans, and why not.
func (c Classes) PoolSpan(pool string, quotaBps int64, hosts int, speedsBps []int64) (bool, string) {
	var span, speed int64
	for _, s := range speedsBps {
		span = add(span, c.Reservable(s))
		speed = add(speed, s)
	}
	if quotaBps <= span {
		return true, ""
	}
	return false, fmt.Sprintf("pool %s: quota %s is more than reservationCap %s × the %s of the uplinks of its %d host(s) = %s",
		pool, Rate(quotaBps), c.capText(), Rate(speed), hosts, Rate(span))
}

// Quota is a cluster-wide bound that VMs draw on wherever they run: a
// network pool's reservation (bits/s) or a datastore's IOPS.
type Quota struct {
	Kind string // "pool" or "datastore"
	Name string
	// Cap is the quota (Unlimited: none); Used what the VMs counted
	// reserve of it.
	Cap, Used int64
	// Why says where Cap comes from, for reasons (may be empty).
	Why string
}

func (q *Quota) amount(x int64) string {
	if q.Kind == "pool" {
		return Rate(x)
	}
	return IOPS(x)
}

func (q *Quota) why() string {
	if q.Why == "" {
		return ""
	}
	return "; " + q.Why
}

// Fit reports whether need more fits in q, and why not.
func (q *Quota) Fit(need int64) (bool, string) {
	if need == 0 || q.Cap == Unlimited || add(q.Used, need) <= q.Cap {
		return true, ""
	}
	free := max(q.Cap-q.Used, 0)
	of := "of " + q.amount(q.Cap)
	if q.Kind == "pool" {
		of = "of quota " + q.amount(q.Cap)
	}
	return false, fmt.Sprintf("%s %s: needs %s, free %s %s (short %s%s)",
		q.Kind, q.Name, q.amount(need), q.amount(free), of, q.amount(need-free), q.why())
}

// Add counts need more as used.
func (q *Quota) Add(need int64) { q.Used = add(q.Used, need) }

// Remove takes need, once added, off what is used.
func (q *Quota) Remove(need int64) { q.Used = sub(q.Used, need) }

// Holds reports whether what is used fits in q.
func (q *Quota) Holds() bool { return q.Cap == Unlimited || q.Used <= q.Cap }

// Broken says why q does not hold.
func (q *Quota) Broken() string {
	if q.Kind == "pool" {
		return fmt.Sprintf("pool %s: vNIC reservations %s exceed its quota %s (short %s%s)",
			q.Name, Rate(q.Used), Rate(q.Cap), Rate(q.Used-q.Cap), q.why())
	}
	return fmt.Sprintf("datastore %s: disk reservations %s exceed its capacity %s (short %s%s)",
		q.Name, IOPS(q.Used), IOPS(q.Cap), IOPS(q.Used-q.Cap), q.why())
}
