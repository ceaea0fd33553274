package sim

import "sluice/alloc"

// The simulator drives the core packages themselves, never copies:
// hclock schedules every uplink under NetIOC (net.go), mclock schedules
// each host's I/O to a datastore and parda sets the host windows
// (storage.go), placement repairs faults (placement.go), and alloc
// computes the entitlements recorded next to the measured rates.

// compute is the entitlement function of DESIGN.md §2.
var compute = alloc.Compute
