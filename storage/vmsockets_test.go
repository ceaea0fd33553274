package storage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/storage/nbd"
)

// VMSockets follow the VMs the gateway serves: Sync opens one socket per
// VM, on which that VM opens its disk; a VM that leaves with the policy
// loses its socket and the others keep theirs; Close removes them all.
func TestVMSockets(t *testing.T) {
	g := newTestGateway(t)
	dir := filepath.Join(t.TempDir(), "socks")
	socks := func() []string {
		names, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
		for i, n := range names {
			names[i] = filepath.Base(n)
		}
		return names
	}
	var none *VMSockets // --socket-dir none
	if err := none.Sync(); err != nil {
		t.Errorf("Sync of no sockets: %v", err)
	}
	none.Close()

	vs := NewVMSockets(g, dir, DefaultSocketPerm)
	if err := vs.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, want := socks(), []string{"a.sock", "b.sock", "c.sock", "d.sock"}; !slices.Equal(got, want) {
		t.Fatalf("sockets %v, want %v", got, want)
	}
	a, err := os.Stat(VMSocket(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.Dial(ctx, "unix", VMSocket(dir, "a"), "a/d0")
	if err != nil {
		t.Fatalf("a opens its disk on its socket: %v", err)
	}
	roundTrip(t, c, 0)
	c.Close()

	// b leaves the host's policy.
	var without []string
	for _, line := range strings.SplitAfter(oneHostPolicy, "\n") {
		if !strings.Contains(line, "{name: b,") {
			without = append(without, line)
		}
	}
	if err := g.SetPolicy(parsePolicy(t, strings.Join(without, ""))); err != nil {
		t.Fatal(err)
	}
	if err := vs.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, want := socks(), []string{"a.sock", "c.sock", "d.sock"}; !slices.Equal(got, want) {
		t.Errorf("after b left: sockets %v, want %v", got, want)
	}
	if again, err := os.Stat(VMSocket(dir, "a")); err != nil || !os.SameFile(a, again) {
		t.Errorf("a's socket was not kept: %v", err)
	}
	if err := vs.Sync(); err != nil || strings.Join(socks(), " ") != "a.sock c.sock d.sock" {
		t.Errorf("Sync again changed the sockets (%v): %v", err, socks())
	}

	vs.Close()
	if got := socks(); len(got) != 0 {
		t.Errorf("sockets left after Close: %v", got)
	}
}
