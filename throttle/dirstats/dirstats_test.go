package dirstats

import (
	"os"
	"path/filepath"
	"testing"

	"sluice/parda"
)

// Two hosts share a directory: each reads both records; a torn file is
// skipped; a host writes only its own record.
func TestTwoHosts(t *testing.T) {
	dir := t.TempDir()
	h1, h2 := Dir{Path: dir, Host: "h1"}, Dir{Path: dir, Host: "h2"}
	if recs, err := h1.Read(); err != nil || len(recs) != 0 {
		t.Fatalf("empty datastore: %v %v", recs, err)
	}
	r1 := parda.Record{Host: "h1", PeriodEndNs: 5e9, PeriodNs: 1e9, IOs: 100, NormLatSumNs: 100 * 12e6, Window: 10, ActiveShares: 2000}
	r2 := parda.Record{Host: "h2", PeriodEndNs: 5e9, PeriodNs: 1e9, IOs: 50, NormLatSumNs: 50 * 14e6, Window: 15, ActiveShares: 3000}
	if err := h1.Write(r1); err != nil {
		t.Fatal(err)
	}
	if err := h2.Write(r2); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, Subdir, "h3.rec"), []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := h2.Read()
	if err != nil || len(recs) != 2 || recs[0] != r1 || recs[1] != r2 {
		t.Fatalf("Read = %+v, %v; want h1's and h2's records", recs, err)
	}
	if err := h1.Write(r2); err == nil {
		t.Fatal("h1 wrote h2's record")
	}
}
