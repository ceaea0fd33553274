package storage

import (
	"math"
	"math/bits"
	"time"
	"unsafe"

	"sluice/alloc"
	"sluice/entitle"
	"sluice/parda"
)

// diskPeriod accumulates one disk's completed I/O during a period.
type diskPeriod struct {
	ios      uint64
	bytes    uint64
	latSumNs float64
	hist     latencyHist
}

func (d *disk) record(n int, lat time.Duration) {
	d.cur.ios++
	d.cur.bytes += uint64(n)
	d.cur.latSumNs += float64(lat.Nanoseconds())
	d.cur.hist.add(lat.Nanoseconds())
}

// latencyHist is a log-linear histogram of latencies (8 sub-buckets per
// power of two: ≤ 12.5% error), enough for a p99 per period.
type latencyHist struct {
	counts [64 * 8]uint32
	n      uint64
}

func histBucket(ns int64) int {
	if ns < 8 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // ns in [2^e, 2^(e+1))
	m := int((uint64(ns) >> (e - 3)) & 7)
	return e*8 + m
}

func histUpperNs(b int) float64 {
	if b < 8 {
		return float64(b)
	}
	e, m := b/8, b%8
	return math.Ldexp(float64(8+m+1), e-3)
}

func (h *latencyHist) add(ns int64) {
	h.counts[histBucket(ns)]++
	h.n++
}

// quantileNs is the upper bound of the bucket holding quantile q.
func (h *latencyHist) quantileNs(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	var acc uint64
	for b, c := range h.counts {
		acc += uint64(c)
		if acc >= rank && c > 0 {
			return histUpperNs(b)
		}
	}
	return 0
}

// LatencyBoundsS are the upper bounds (seconds) of LatencyHistogram's
// buckets, as Prometheus's le.
var LatencyBoundsS = [...]float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10}

// LatencyHistogram is a cumulative histogram of request latencies with
// the buckets of LatencyBoundsS, folded from the per-period log-linear
// histograms when each period closes (nothing per request). A request
// counts in the first bucket whose bound is at least the upper end of
// its log-linear bucket, so a bucket may miss requests up to 12.5% below
// its bound (they count in the next one); Count and SumS are exact.
type LatencyHistogram struct {
	// Counts[i] is the number of requests in bucket i (not cumulative);
	// Counts[len(LatencyBoundsS)] those above the last bound.
	Counts [len(LatencyBoundsS) + 1]uint64
	Count  uint64
	SumS   float64
}

// latencyBucketOf maps each log-linear bucket to its LatencyHistogram
// bucket.
var latencyBucketOf = func() (m [64 * 8]uint8) {
	for b := range m {
		up := histUpperNs(b) / 1e9
		i := 0
		for i < len(LatencyBoundsS) && LatencyBoundsS[i] < up {
			i++
		}
		m[b] = uint8(i)
	}
	return m
}()

// add folds one period's latencies into h.
func (h *LatencyHistogram) add(p *diskPeriod) {
	if p.ios == 0 {
		return
	}
	for b, c := range p.hist.counts {
		if c > 0 {
			h.Counts[latencyBucketOf[b]] += uint64(c)
		}
	}
	h.Count += p.ios
	h.SumS += p.latSumNs / 1e9
}

// entitleDisks sets the EntitlementIOPS of one datastore's disks from
// the IOPS they completed: their sum is the capacity divided by floor
// semantics (package alloc, as mClock schedules), each disk's demand
// unbounded when wants says a request of it waited, else what it
// completed.
func entitleDisks(ds []DiskStatus, wants []bool) {
	root := entitle.StorageRoot("")
	var capacity float64
	for i, d := range ds {
		spec := entitle.DiskSpec{Name: d.Disk, ReservationIOPS: float64(d.ReservationIOPS), Shares: float64(d.Shares), LimitIOPS: alloc.Inf}
		if d.LimitIOPS > 0 {
			spec.LimitIOPS = float64(d.LimitIOPS)
		}
		demand := d.IOPS
		if wants[i] {
			demand = alloc.Inf
		}
		root.Children = append(root.Children, entitle.DiskNode(spec, demand))
		capacity += d.IOPS
	}
	alloc.Compute(root, capacity)
	for i, n := range root.Children {
		ds[i].EntitlementIOPS = n.Alloc
	}
}

// Status is what a gateway reports: per disk and per datastore, measured
// over the last complete period.
type Status struct {
	Host       string  `json:"host"`
	TimeUnixNs int64   `json:"time_unix_ns"`
	PeriodS    float64 `json:"period_s"`
	Listen     string  `json:"listen"`

	Datastores []DatastoreStatus `json:"datastores"`
	Disks      []DiskStatus      `json:"disks"`
}

// DatastoreStatus is one host's view of one datastore.
type DatastoreStatus struct {
	Name string `json:"name"`
	// Window is the host's current limit on outstanding datastore requests.
	Window float64 `json:"window"`
	// DatastoreLatencyMs is the datastore-wide IOPS-weighted mean of the
	// hosts' size-normalised device latency in the last period.
	DatastoreLatencyMs float64 `json:"datastore_latency_ms"`
	// HostLatencyMs is this host's size-normalised device latency.
	HostLatencyMs float64 `json:"host_latency_ms"`
	HostIOPS      float64 `json:"host_iops"`
	ThresholdMs   float64 `json:"threshold_ms"`
	ActiveShares  float64 `json:"active_shares"`
	HostsSeen     int     `json:"hosts_seen"`
	Outstanding   int     `json:"outstanding"`
	SIOC          bool    `json:"sioc"`
	// MeasuredIOPS is the datastore's capacity as measured in the periods
	// it was congested in (parda.Capacity; 0: fewer than
	// parda.MinCapacityPeriods of them yet, CapacityPeriods so far).
	MeasuredIOPS    float64 `json:"measured_iops"`
	CapacityPeriods int     `json:"capacity_periods"`
	// Error, when set, is why every request to the datastore fails (it
	// came back empty or was replaced).
	Error string `json:"error,omitempty"`
}

// DiskStatus is one disk's I/O in the last period, latency as the VM sees
// it (gateway queueing included).
type DiskStatus struct {
	Disk            string  `json:"disk"`
	Datastore       string  `json:"datastore"`
	Volume          string  `json:"volume"` // its name on the datastore
	Shares          int     `json:"shares"`
	ReservationIOPS int64   `json:"reservation_iops"`
	LimitIOPS       int64   `json:"limit_iops"` // 0: unlimited
	IOPS            float64 `json:"iops"`
	MBps            float64 `json:"mbps"`
	LatencyMeanMs   float64 `json:"latency_mean_ms"`
	LatencyP99Ms    float64 `json:"latency_p99_ms"`
	Outstanding     int     `json:"outstanding"`
	// EntitlementIOPS is what mClock's floor semantics give the disk of
	// the I/Os this host completed on the disk's datastore in the period:
	// max(its reservation, its share by shares), capped by its limit and,
	// when none of its requests waited in the gateway at the period's end,
	// by the IOPS it completed (it asked for no more).
	EntitlementIOPS float64 `json:"entitlement_iops"`
	// Latency holds the latency (as the VM sees it) of every request the
	// disk completed here since the gateway opened it, up to the end of
	// the last period; the metrics' histogram.
	Latency LatencyHistogram `json:"-"`
	// ReadsTotal and WritesTotal count the reads and writes this gateway
	// completed successfully for the disk since it started serving it
	// (acknowledged to the VM or about to be), up to the status's time.
	ReadsTotal  uint64 `json:"reads_total"`
	WritesTotal uint64 `json:"writes_total"`
	// Error, when set, is why the disk's FLUSHes fail: acknowledged writes
	// may have been lost.
	Error string `json:"error,omitempty"`
}

// encodeStatsRecord lays the record out in a StatsSlotBytes block
// (parda.Record.Encode).
func encodeStatsRecord(r statsRecord) []byte { return r.Encode(StatsSlotBytes) }

func decodeStatsRecord(b []byte) (statsRecord, bool) { return parda.DecodeRecord(b) }

// slotRead is one slot of the stats volume as read.
type slotRead struct {
	rec statsRecord
	ok  bool // a valid record
}

// minScan is how many slots a period reads at least.
const minScan = 4

// claimable reports whether a host may take slot s as its own at nowNs:
// it is empty, holds host's record, or its record is older than 10 of its
// periods and 30 s (its host is gone).
func claimable(s slotRead, host string, nowNs int64) bool {
	return !s.ok || s.rec.Host == host || nowNs-s.rec.PeriodEndNs > max(10*s.rec.PeriodNs, 30e9)
}

// chooseSlot decides host's slot in the stats volume from the slots read,
// and how many slots to read next period. A host keeps its slot while no
// other live host writes there; otherwise it takes the slot already
// holding its name (after a restart), else the lowest claimable one. Two
// hosts that took the same slot at once see each other's record there:
// the one that reads the other's moves on. Slots are thus keyed by host
// name, never by the host's position in the policy. The scan covers the
// highest live slot plus minScan, so it grows as hosts arrive.
func chooseSlot(host string, cur int, slots []slotRead, nowNs int64) (slot, scan int) {
	slot = -1
	if cur >= 0 && (cur >= len(slots) || claimable(slots[cur], host, nowNs)) {
		slot = cur
	}
	if slot < 0 {
		for k, s := range slots {
			if s.ok && s.rec.Host == host {
				slot = k
				break
			}
		}
	}
	if slot < 0 {
		slot = len(slots)
		for k, s := range slots {
			if claimable(s, host, nowNs) {
				slot = k
				break
			}
		}
	}
	top := slot
	for k, s := range slots {
		if !claimable(s, host, nowNs) {
			top = max(top, k)
		}
	}
	return min(slot, statsSlots-1), min(top+1+minScan, statsSlots)
}

// alignedBuf is a zeroed buffer of n bytes aligned to 4096 in memory, as
// O_DIRECT needs.
func alignedBuf(n int) []byte { return alignedTo(n, 4096) }

// alignedTo is a zeroed buffer of n bytes aligned to align (a power of
// two) in memory.
func alignedTo(n, align int) []byte {
	b := make([]byte, n+align)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & uintptr(align-1))
	return b[off : off+n : off+n]
}
