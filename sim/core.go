package sim

import "sluice/alloc"

// The core algorithms the simulator drives: the same functions the live
// agent calls. Where a core package is not in the tree yet, a stand-in
// written after DESIGN.md §2 is used instead (see docs/sim.md).

// compute is the entitlement function of DESIGN.md §2.
var compute = alloc.Compute
