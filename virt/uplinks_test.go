package virt

import (
	"flag"
	"testing"
)

func TestUplinksFlag(t *testing.T) {
	var u Uplinks
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.Var(&u, "uplink", "NAME=DEVICE")
	if err := fs.Parse([]string{"--uplink", "vmnic0=bond0", "--uplink", "vmnic1=eno2.100,vmnic2=eth1"}); err != nil {
		t.Fatal(err)
	}
	if got := u.String(); got != "vmnic0=bond0,vmnic1=eno2.100,vmnic2=eth1" {
		t.Errorf("String = %q", got)
	}
	for _, bad := range []string{"vmnic0", "=bond0", "vmnic0=", "vmnic0=bond1", "x=a/b", "y=averyveryverylongname"} {
		if err := u.Set(bad); err == nil {
			t.Errorf("Set(%q): no error", bad)
		}
	}
}
