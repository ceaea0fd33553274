package lab

import (
	"os"
	"path/filepath"
	"testing"

	"sluice/policy"
)

// A VM's disk URI names its own socket, a link to its host's gateway
// socket; a move re-points the link (when the lab's sockets directory
// exists), and a plan of another state directory creates nothing.
func TestDiskSocketLink(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte(`cluster: c1
hosts:
  - {name: h1, uplinks: [{name: up0, speed: 1Gbps}]}
  - {name: h2, uplinks: [{name: up0, speed: 1Gbps}]}
datastores: [{name: ds1}]
vms:
  - {name: vm1, host: h1, disks: [{name: d0, datastore: ds1, size: 1MiB}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pl.useStateDir(dir)
	link := VMDiskSocket(dir, "c1", "vm1")
	if want := "nbd+unix:///vm1/d0?socket=" + link; pl.VM("vm1").Disks[0].URI != want {
		t.Errorf("URI %q, want %q", pl.VM("vm1").Disks[0].URI, want)
	}
	if err := pl.linkDiskSocket("vm1", "h2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); err == nil {
		t.Error("a link was made without the lab's sockets directory")
	}
	for _, step := range []struct {
		host   string
		create bool
	}{{"h1", true}, {"h2", false}} {
		if err := pl.linkDiskSocket("vm1", step.host, step.create); err != nil {
			t.Fatal(err)
		}
		got, err := os.Readlink(link)
		if err != nil || filepath.Join(filepath.Dir(link), got) != GatewaySocket(dir, "c1", step.host) {
			t.Errorf("link → %q (%v), want %s", got, err, GatewaySocket(dir, "c1", step.host))
		}
	}
}
