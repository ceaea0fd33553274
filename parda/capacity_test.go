package parda

import "testing"

func TestCapacityCountsCongestedPeriods(t *testing.T) {
	const thr = 12e6
	var c Capacity
	// Below the threshold the hosts asked for less than the datastore
	// serves: nothing is learnt, however much they did.
	for i := 0; i < 20; i++ {
		c = c.Observe(View{LatNs: 4e6, IOPS: 900}, thr, int64(i))
	}
	if _, ok := c.Estimate(); ok || c.Periods() != 0 {
		t.Fatalf("uncongested periods counted: %d periods", c.Periods())
	}
	for i, iops := range []float64{480, 520, 490} {
		c = c.Observe(View{LatNs: 40e6, IOPS: iops}, thr, int64(100+i))
	}
	if _, ok := c.Estimate(); ok {
		t.Fatalf("an estimate from %d periods, want none before %d", c.Periods(), MinCapacityPeriods)
	}
	// A period with no I/O, or an unknown threshold, says nothing.
	c = c.Observe(View{LatNs: 40e6}, thr, 200).Observe(View{LatNs: 40e6, IOPS: 10}, 0, 201)
	for i, iops := range []float64{500, 60} { // 60: a period cut short
		c = c.Observe(View{LatNs: thr, IOPS: iops}, thr, int64(300+i))
	}
	got, ok := c.Estimate()
	if !ok || got != 490 || c.Periods() != 5 || c.LastNs != 301 {
		t.Fatalf("estimate %v (%v) over %d periods, last %d; want the median 490 over 5, last 301", got, ok, c.Periods(), c.LastNs)
	}
}

func TestCapacityFollowsTheLastPeriods(t *testing.T) {
	var c Capacity
	for i := 0; i < CapacityPeriods; i++ {
		c = c.Observe(View{LatNs: 50e6, IOPS: 1000}, 30e6, int64(i))
	}
	// The datastore lost half its speed (a failed disk, a rebuild):
	// after half the ring and one more the median is the new rate.
	for i := 0; i <= CapacityPeriods/2; i++ {
		c = c.Observe(View{LatNs: 50e6, IOPS: 500}, 30e6, int64(1000+i))
	}
	if got, _ := c.Estimate(); got != 500 || c.Periods() != CapacityPeriods {
		t.Fatalf("estimate %v over %d periods, want 500 over %d", got, c.Periods(), CapacityPeriods)
	}
}

func TestViewIOPS(t *testing.T) {
	now := int64(10e9)
	recs := []Record{
		{Host: "h1", PeriodEndNs: now, PeriodNs: 1e9, IOs: 300, NormLatSumNs: 300 * 5e6},
		{Host: "h2", PeriodEndNs: now - 5e8, PeriodNs: 2e9, IOs: 400, NormLatSumNs: 400 * 5e6},
		{Host: "h3", PeriodEndNs: now - 4e9, PeriodNs: 1e9, IOs: 999}, // stale: not counted
	}
	if v := ViewOf(recs, now); v.IOPS != 500 || v.Hosts != 2 {
		t.Fatalf("view %+v, want 500 IOPS (300/1 s + 400/2 s) from 2 hosts", v)
	}
}
