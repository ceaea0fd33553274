package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// datastore create refuses a datastore whose driver is throttle, in one
// line, and makes nothing.
func TestDatastoreCreateThrottle(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte(`cluster: t
hosts:
  - name: h1
    uplinks: [{name: u0, speed: 10Gbps}]
datastores:
  - name: ds1
    driver: throttle
vms:
  - name: vm1
    host: h1
    disks: [{name: d0, datastore: ds1}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	ds := filepath.Join(dir, "ds1")
	code := runDatastore([]string{"create", "--policy", file, "ds1=" + ds}, &out, &errb)
	if code != exitBad || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), "datastore ds1 has driver throttle") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	if _, err := os.Stat(ds); !os.IsNotExist(err) {
		t.Errorf("%s made (%v)", ds, err)
	}
}
