package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/policy"
	"sluice/storage"
)

// --datastore and --datastore-probe: bad input is one clear error, and a
// datastore the gateway made is left to the gateway (no libvirt needed).
func TestStartThrottlerInput(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: ds1
  - name: ds2
    driver: throttle
vms:
  - name: vm1
    host: h1
    disks: [{name: d0, datastore: ds1}, {name: d1, datastore: ds2}]
`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	made := filepath.Join(dir, "made")
	if err := os.MkdirAll(made, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(made, storage.StatsVolume), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dss, probes []string
		want        string
	}{
		{[]string{"ds1"}, nil, `--datastore "ds1": want DS=DIR (an absolute directory)`},
		{[]string{"ds9=" + dir}, nil, "no datastore ds9 in the policy"},
		{[]string{"ds2=" + filepath.Join(dir, "nope")}, nil, "is not a directory (is the datastore mounted?)"},
		{[]string{"ds2=" + dir}, []string{"ds2=tcp://x"}, "--datastore-probe ds2=tcp://x: want dir, none or nbd+unix:///EXPORT?socket=PATH"},
		{[]string{"ds2=" + dir}, []string{"ds2"}, `--datastore-probe "ds2": want DS=dir`},
	} {
		_, _, err := startThrottler(p, "h1", tc.dss, tc.probes, "/nonexistent", dir, nil, func(string, ...any) {})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v %v: %v, want one line with %q", tc.dss, tc.probes, err, tc.want)
		}
	}
	var logged []string
	th, closeTh, err := startThrottler(p, "h1", []string{"ds1=" + made}, nil, "/nonexistent", dir, nil, func(f string, a ...any) { logged = append(logged, f) })
	if err != nil || th != nil {
		t.Fatalf("a datastore the gateway made: %v, %v; want no throttler", th, err)
	}
	closeTh()
	if len(logged) != 1 {
		t.Errorf("logged %q, want one line saying the gateway controls ds1", logged)
	}
}
