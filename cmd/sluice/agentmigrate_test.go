package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestMigrateFlags: --migrate-peer takes HOST=URI pairs, once per host.
func TestMigrateFlags(t *testing.T) {
	var f migrateFlags
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	err := fs.Parse([]string{"--migrate-uri", "qemu+tls://h2/system", "--migrate-peer", "h1=qemu+tls://h1/system", "--migrate-peer", "h3=qemu+ssh://root@h3/system"})
	if err != nil || f.uri != "qemu+tls://h2/system" || f.peers.String() != "h1=qemu+tls://h1/system,h3=qemu+ssh://root@h3/system" {
		t.Fatalf("parse: %v, %+v", err, f)
	}
	for arg, want := range map[string]string{
		"h1":                         `migrate-peer "h1": want HOST=URI, e.g. h1=qemu+tls://h1.example.org/system`,
		"=qemu:///system":            `migrate-peer "=qemu:///system": want HOST=URI`,
		"h1=qemu+tls://other/system": "migrate-peer h1 given twice (qemu+tls://h1/system and qemu+tls://other/system)",
	} {
		if err := f.peers.Set(arg); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("--migrate-peer %s: error %v, want %q", arg, err, want)
		}
	}
}

// TestLibvirtMoverErrors: without --migrate-uri the move is refused with
// the flag named; without peers the agent says it cannot find the VM.
func TestLibvirtMoverErrors(t *testing.T) {
	sock := t.TempDir() + "/no-libvirt-sock"
	err := (&migrateFlags{}).mover("h2", sock)("vm1")
	if err == nil || !strings.Contains(err.Error(), "give the agent --migrate-uri") {
		t.Errorf("no --migrate-uri: %v", err)
	}
	err = (&migrateFlags{uri: "qemu+tls://h2/system", peers: hostURIs{"h2": "qemu+tls://h2/system"}}).mover("h2", sock)("vm1")
	if err == nil || err.Error() != "no --migrate-peer: the agent cannot find the libvirtd that runs vm1" {
		t.Errorf("no peers: %v", err)
	}
	err = (&migrateFlags{uri: "qemu+tls://h2/system", peers: hostURIs{"h1": "qemu+unix:///system?socket=" + sock}}).mover("h2", sock)("vm1")
	if err == nil || !strings.HasPrefix(err.Error(), "vm1 runs on none of the peers h1\npeer h1: libvirt connect") {
		t.Errorf("unreachable peer: %v", err)
	}
}
