// Package parda controls how many I/Os each host may have outstanding on a
// shared datastore, from the datastore-wide latency: PARDA (Gulati, Ahmad,
// Waldspurger, FAST 2009), the host-level half of Storage I/O Control
// (seed 002). Every control period (4 s by default) each host computes the
// datastore-wide latency from all hosts' reports and updates its window
//
//	w ← (1−γ)·w + γ·((threshold/latency)·w + β),   β = BetaPerShare·activeShares
//
// clamped to [Min, Max] (default [4, 256]). At the fixed point latency
// exceeds the threshold by just enough that every host's window is
// proportional to β, that is to the aggregate shares of its active VMs:
// w = β·latency/(latency − threshold). Inside a host the window is divided
// among VMs by a local scheduler (package mclock).
//
// UpdateScaled is the scaled variant of the law that the live storage
// gateway and the simulator (models.storage.parda: scaled) use: β is a
// fraction b (ShareTerm) of the datastore's total window, split by shares,
// and the threshold is lowered to (1−b)·threshold, so that the fixed point
// is latency = threshold exactly and windows in the ratio of the hosts'
// active shares, whatever the array's speed.
//
// parda is pure: it takes measurements and returns windows. It never reads
// a clock, does I/O, or keeps history beyond what Update returns; the
// caller (the storage gateway, the simulator) runs the period.
package parda

import (
	"errors"
	"fmt"
	"math"
)

// Defaults (Config's zero fields take them).
const (
	DefaultPeriodNs     = 4_000_000_000 // control period, 4 s
	DefaultGamma        = 0.8
	DefaultBetaPerShare = 1e-3 // windows per share: shares 2000 → β = 2
	DefaultMin          = 4
	DefaultMax          = 256
	DefaultShareTerm    = 0.3 // b of UpdateScaled
)

// Config configures a Controller. ThresholdNs is required; zero values of
// the other fields take the defaults above.
type Config struct {
	// ThresholdNs is the congestion threshold: the datastore-wide
	// (normalised) latency the controller steers toward, in ns.
	ThresholdNs float64
	// Gamma is the smoothing factor γ in (0, 1]: the weight of the new
	// estimate against the current window.
	Gamma float64
	// BetaPerShare scales the host's aggregate active shares into β, the
	// additive term that sets each host's part of the datastore queue.
	// Larger β moves windows toward their share ratio faster, at the price
	// of a fixed-point latency further above the threshold.
	BetaPerShare float64
	// ShareTerm is b in (0, 1) of UpdateScaled: the fraction of the
	// datastore's total window that the share term redistributes every
	// period. Larger b moves windows toward their share ratio faster
	// (by a factor 1−γ·b per period); Update ignores it.
	ShareTerm float64
	// Min and Max bound the window (I/Os outstanding per host).
	Min, Max float64
	// MinStep and MaxStep bound, in UpdateScaled, the factor by which
	// the datastore's total window moves in a period (0: unbounded): the
	// latency term's factor (1−γ)+γ·L'/latency is bounded to them minus
	// γ·b, and the share term β is added unbounded, so that the windows
	// still settle in the ratio of the hosts' shares (a bound on each
	// host's whole step would keep whatever ratio the windows had). For
	// a driver that needs small steps: the throttle driver.
	MinStep, MaxStep float64
	// PeriodNs is the control period; Update does not read it, it is here
	// so that drivers share one setting.
	PeriodNs int64
}

// WithDefaults returns cfg with its zero fields set to the defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Gamma == 0 {
		cfg.Gamma = DefaultGamma
	}
	if cfg.BetaPerShare == 0 {
		cfg.BetaPerShare = DefaultBetaPerShare
	}
	if cfg.ShareTerm == 0 {
		cfg.ShareTerm = DefaultShareTerm
	}
	if cfg.Min == 0 {
		cfg.Min = DefaultMin
	}
	if cfg.Max == 0 {
		cfg.Max = DefaultMax
	}
	if cfg.PeriodNs == 0 {
		cfg.PeriodNs = DefaultPeriodNs
	}
	return cfg
}

// Validate reports the first invalid field of cfg (after defaults).
func (cfg Config) Validate() error {
	c := cfg.WithDefaults()
	switch {
	case !(c.ThresholdNs > 0) || math.IsInf(c.ThresholdNs, 0):
		return fmt.Errorf("threshold %v ns: must be > 0", c.ThresholdNs)
	case !(c.Gamma > 0 && c.Gamma <= 1):
		return fmt.Errorf("gamma %v: must be in (0, 1]", c.Gamma)
	case !(c.BetaPerShare > 0) || math.IsInf(c.BetaPerShare, 0):
		return fmt.Errorf("beta per share %v: must be > 0", c.BetaPerShare)
	case !(c.ShareTerm > 0 && c.ShareTerm < 1):
		return fmt.Errorf("share term %v: must be in (0, 1)", c.ShareTerm)
	case !(c.Min >= 1 && c.Max >= c.Min) || math.IsInf(c.Max, 0):
		return fmt.Errorf("window bounds [%v, %v]: need 1 ≤ min ≤ max", c.Min, c.Max)
	case c.PeriodNs <= 0:
		return errors.New("period must be > 0")
	}
	return nil
}

// Controller computes window updates. It holds only its configuration, so
// one Controller can serve every host of a datastore.
type Controller struct {
	cfg Config
}

// New returns a Controller for cfg with defaults applied. Check
// cfg.Validate first when cfg comes from user input; New clamps what it
// cannot use (γ into (0, 1], Max ≥ Min ≥ 1).
func New(cfg Config) *Controller {
	c := cfg.WithDefaults()
	c.Gamma = math.Min(math.Max(c.Gamma, 1e-6), 1)
	c.Min = math.Max(c.Min, 1)
	c.Max = math.Max(c.Max, c.Min)
	if !(c.ShareTerm > 0 && c.ShareTerm < 1) {
		c.ShareTerm = DefaultShareTerm
	}
	return &Controller{cfg: c}
}

// Config returns the controller's configuration, defaults applied.
func (c *Controller) Config() Config { return c.cfg }

// WithSteps is c with the latency term's factor per period bounded to
// [lo, hi] (Config.MinStep, MaxStep).
func (c *Controller) WithSteps(lo, hi float64) *Controller {
	cfg := c.cfg
	cfg.MinStep, cfg.MaxStep = lo, hi
	return &Controller{cfg: cfg}
}

// Beta returns β for a host whose active VMs hold activeShares shares.
func (c *Controller) Beta(activeShares float64) float64 {
	return c.cfg.BetaPerShare * math.Max(activeShares, 0)
}

// Update returns the host's next window from its current window win, the
// datastore-wide latency of the last period (DatastoreLatency) and the
// aggregate shares of the host's active VMs. A latency ≤ 0 (no I/O
// completed on the datastore) carries no information: the window is kept
// (clamped).
func (c *Controller) Update(win, datastoreLatencyNs, activeShares float64) float64 {
	w := win
	if datastoreLatencyNs > 0 && !math.IsInf(datastoreLatencyNs, 0) {
		g := c.cfg.Gamma
		w = (1-g)*win + g*(c.cfg.ThresholdNs/datastoreLatencyNs*win+c.Beta(activeShares))
	}
	if math.IsNaN(w) {
		w = c.cfg.Min
	}
	return math.Min(math.Max(w, c.cfg.Min), c.cfg.Max)
}

// FixedPoint returns the window a host with activeShares settles at when
// the datastore latency is latencyNs (> threshold): β·L/(L − threshold),
// clamped; Max when latencyNs ≤ threshold.
func (c *Controller) FixedPoint(latencyNs, activeShares float64) float64 {
	if latencyNs <= c.cfg.ThresholdNs {
		return c.cfg.Max
	}
	w := c.Beta(activeShares) * latencyNs / (latencyNs - c.cfg.ThresholdNs)
	return math.Min(math.Max(w, c.cfg.Min), c.cfg.Max)
}

// UpdateScaled is the scaled law: the host's next window from its current
// window win, the datastore-wide latency of the last period, the aggregate
// shares of the host's active VMs and the sums of active shares
// (totalShares) and windows (totalWindow) over all hosts of the datastore,
// this one included:
//
//	w ← (1−γ)·w + γ·((L'/latency)·w + β),  L' = (1−b)·threshold,
//	                                       β  = b·totalWindow·shares/totalShares
//
// with b = ShareTerm, and the window at most doubles per period (so that a
// host coming back from idle does not flood the datastore), then clamped
// to [Min, Max]. Summed over the hosts the law keeps the total window
// still only when latency = threshold; each window's fixed point is then
// totalWindow·shares/totalShares. The share split converges by a factor
// 1−γ·b per period. Classic PARDA (Update) settles at
// latency = threshold + Σβ/IOPS instead, which depends on the array.
// A latency ≤ 0 (no I/O on the datastore) keeps the window (clamped);
// totalShares ≤ 0 gives β = 0.
func (c *Controller) UpdateScaled(win, datastoreLatencyNs, activeShares, totalShares, totalWindow float64) float64 {
	w := win
	if datastoreLatencyNs > 0 && !math.IsInf(datastoreLatencyNs, 0) {
		b, g := c.cfg.ShareTerm, c.cfg.Gamma
		beta := 0.0
		if totalShares > 0 && activeShares > 0 && totalWindow > 0 {
			beta = b * totalWindow * activeShares / totalShares
		}
		thr := (1 - b) * c.cfg.ThresholdNs
		// The datastore's total window moves by m + γ·b (the β terms add
		// up to γ·b·totalWindow): bounding m to [MinStep, MaxStep] − γ·b
		// bounds the total's step.
		m := (1 - g) + g*thr/datastoreLatencyNs
		if c.cfg.MinStep > 0 {
			m = math.Max(m, c.cfg.MinStep-g*b)
		}
		if c.cfg.MaxStep > 0 {
			m = math.Min(m, c.cfg.MaxStep-g*b)
		}
		w = m*win + g*beta
		w = math.Min(w, 2*win)
	}
	if math.IsNaN(w) {
		w = c.cfg.Min
	}
	return math.Min(math.Max(w, c.cfg.Min), c.cfg.Max)
}

// Hold returns next, the window the law computed from win, except that a
// window the host did not fill during the period does not grow: if its
// peak of outstanding I/Os stayed below ⌊win⌋, a latency under the
// threshold says nothing about a larger window, and the window is kept at
// win (clamped). Without it a host with little I/O (guests booting, a VM
// doing a few IOPS) climbs to Max, and the first congestion then takes
// many periods to bring it down. Decreases pass unchanged. (TCP keeps its
// congestion window the same way: RFC 7661.)
func (c *Controller) Hold(win, next float64, peakOutstanding int) float64 {
	if next > win && float64(peakOutstanding) < math.Floor(win) {
		return math.Min(math.Max(win, c.cfg.Min), c.cfg.Max)
	}
	return next
}
