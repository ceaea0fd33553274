package parda

// HostReport is what one host measured on the datastore in the last
// control period.
type HostReport struct {
	// IOs is the number of I/Os the host completed in the period (the
	// weight of its latency in the datastore-wide mean).
	IOs float64
	// LatencyNs is the mean device latency of those I/Os (issue to
	// completion, as seen by the host), in ns.
	LatencyNs float64
	// MeanBytes is the mean size of those I/Os; 0 means the model's
	// reference size (no normalisation).
	MeanBytes float64
}

// SizeModel normalises latencies for I/O size with a service-time model of
// the device: serving b bytes takes FixedNs + NsPerKiB·b/1024. A latency
// measured at mean size b is scaled to the reference size RefBytes by
// service(RefBytes)/service(b), so that the higher latency of large I/Os is
// not mistaken for congestion (SIOC, "datastore-wide normalized I/O
// latency"). The zero SizeModel normalises nothing.
type SizeModel struct {
	FixedNs  float64 // per-I/O time independent of size (positioning, protocol)
	NsPerKiB float64 // transfer time per KiB
	RefBytes float64 // size latencies are normalised to
}

// DefaultSizeModel is a disk-array-like device: 5 ms per I/O (the array's
// serviceTime default of DESIGN.md §4) plus 20 µs per KiB (~50 MB/s per
// spindle), normalised to 8 KiB I/Os. An 8 KiB I/O counts as is, a 64 KiB
// one at 0.82×, a 256 KiB one at 0.51× its latency.
var DefaultSizeModel = SizeModel{FixedNs: 5e6, NsPerKiB: 20e3, RefBytes: 8 << 10}

func (m SizeModel) serviceNs(bytes float64) float64 {
	return m.FixedNs + m.NsPerKiB*bytes/1024
}

// Normalize returns latencyNs scaled from I/Os of mean size bytes to the
// reference size.
func (m SizeModel) Normalize(latencyNs, bytes float64) float64 {
	if bytes <= 0 || m.RefBytes <= 0 {
		return latencyNs
	}
	num, den := m.serviceNs(m.RefBytes), m.serviceNs(bytes)
	if num <= 0 || den <= 0 {
		return latencyNs
	}
	return latencyNs * num / den
}

// DatastoreLatency is the I/O-count-weighted mean of the hosts' normalised
// latencies, in ns; 0 when no host completed an I/O.
func (m SizeModel) DatastoreLatency(reports []HostReport) (latencyNs float64) {
	var sum, n float64
	for _, r := range reports {
		if r.IOs <= 0 || !(r.LatencyNs >= 0) {
			continue
		}
		sum += r.IOs * m.Normalize(r.LatencyNs, r.MeanBytes)
		n += r.IOs
	}
	if n == 0 {
		return 0
	}
	return sum / n
}

// DatastoreLatency is DefaultSizeModel.DatastoreLatency.
func DatastoreLatency(reports []HostReport) (latencyNs float64) {
	return DefaultSizeModel.DatastoreLatency(reports)
}
