// Package qemumig is the live test of a real QEMU guest's live migration
// between two lab hosts with libvirt (lab.Plan.MigrateGuest) while
// iperf3 runs inside the guest. It needs root, libvirtd and the tools of
// scripts/deps.sh; it is a test only.
package qemumig
