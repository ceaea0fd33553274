package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// sluice version: the make target's -X main.version wins over the
// module's version; the VCS revision (12 digits), its time and whether
// the tree was modified follow when the build stamped them.
func TestVersionText(t *testing.T) {
	stamped := func(version string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "sluice", Version: version}, Settings: settings}, true
		}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0246740563b37b58edc6399a5cc661bdc7059b23"}
	at := debug.BuildSetting{Key: "vcs.time", Value: "2026-11-25T17:40:00Z"}
	mod := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	clean := debug.BuildSetting{Key: "vcs.modified", Value: "false"}
	for _, c := range []struct {
		override string
		read     func() (*debug.BuildInfo, bool)
		want     string
	}{
		{"", stamped("(devel)", rev, at, mod), "sluice (devel) (0246740563b3, 2026-11-25T17:40:00Z, modified) go1.99"},
		{"", stamped("v1.4.0", rev, at, clean), "sluice v1.4.0 (0246740563b3, 2026-11-25T17:40:00Z) go1.99"},
		{"v1.5.0-3-g0246740-dirty", stamped("(devel)", rev, at, mod), "sluice v1.5.0-3-g0246740-dirty (0246740563b3, 2026-11-25T17:40:00Z, modified) go1.99"},
		{"0246740", stamped(""), "sluice 0246740 go1.99"},
		{"", stamped(""), "sluice (devel) go1.99"},
		{"", func() (*debug.BuildInfo, bool) { return nil, false }, "sluice (devel) " + runtime.Version()},
	} {
		if got := buildFrom(c.override, c.read).text(); got != c.want {
			t.Errorf("override %q: %q, want %q", c.override, got, c.want)
		}
	}
	// The variable the make target sets is the one the command prints.
	defer func(v string) { version = v }(version)
	version = "v9.9.9-test"
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version"}, &stdout, &stderr); code != exitOK || !strings.HasPrefix(stdout.String(), "sluice v9.9.9-test ") {
		t.Errorf("sluice version with -X main.version: exit %d %q %q", code, stdout.String(), stderr.String())
	}
}
