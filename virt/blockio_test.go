package virt

import (
	"testing"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/throttle"
)

// blockStatsOf sums each disk's "block.N.*" fields of
// VIR_DOMAIN_STATS_BLOCK under its target, and ignores what is not a
// counter of I/O (a path, allocation, another group's fields).
func TestBlockStatsOf(t *testing.T) {
	u := func(f string, v uint64) libvirt.TypedParam {
		return libvirt.TypedParam{Field: f, Value: libvirt.TypedParamValue{D: 4, I: v}}
	}
	str := func(f, v string) libvirt.TypedParam {
		return libvirt.TypedParam{Field: f, Value: libvirt.TypedParamValue{D: 7, I: v}}
	}
	ps := []libvirt.TypedParam{
		u("block.count", 2),
		str("block.0.name", "vda"), str("block.0.path", "/var/lib/a.qcow2"),
		u("block.0.rd.reqs", 10), u("block.0.rd.bytes", 40960), u("block.0.rd.times", 1000),
		u("block.0.wr.reqs", 5), u("block.0.wr.bytes", 20480), u("block.0.wr.times", 500),
		u("block.0.fl.reqs", 1), u("block.0.fl.times", 50), u("block.0.allocation", 1<<20),
		str("block.1.name", "vdb"), u("block.1.rd.reqs", 3), u("block.1.rd.bytes", 12288), u("block.1.rd.times", 30),
		u("vcpu.current", 1),
	}
	got := blockStatsOf(ps)
	want := map[string]throttle.Counters{"vda": {Ops: 16, Bytes: 61440, TimeNs: 1550}, "vdb": {Ops: 3, Bytes: 12288, TimeNs: 30}}
	if len(got) != len(want) || got["vda"] != want["vda"] || got["vdb"] != want["vdb"] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
