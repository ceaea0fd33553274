package sim

// The simulator drives the core packages themselves, never copies:
// hclock schedules every uplink under NetIOC (net.go), mclock schedules
// each host's I/O to a datastore and parda sets the host windows
// (storage.go), placement repairs faults (placement.go), and entitle
// derives from the policy what every uplink schedules and computes, with
// alloc, the entitlements recorded next to the measured rates (derive.go).
