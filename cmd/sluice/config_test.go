package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfigFile: a daemon's config file sets the flags the command line
// does not (a list for a repeated flag, booleans, durations); the command
// line wins; a key that is no flag, or a bad value, is one line with the
// file and line; without --config the default file is read when it exists.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	old := configDir
	configDir = dir
	defer func() { configDir = old }()
	parse := func(file string, args ...string) (*flag.FlagSet, *string, *multiFlag, *bool, *time.Duration, error) {
		fs := newFlagSet("agent")
		host := fs.String("host", "", "")
		var up multiFlag
		fs.Var(&up, "uplink", "")
		cpu := fs.Bool("cpu", false, "")
		iv := fs.Duration("interval", 100*time.Millisecond, "")
		c := addConfigFlag(fs, "agent")
		if file != "" {
			args = append(args, "--config", file)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs, host, &up, cpu, iv, c.apply(fs, nil)
	}
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f := write("a.yaml", "# the agent of pve1\nhost: pve1\nuplink: [vmnic0=bond0, vmnic1=bond1]\ncpu: true\ninterval: 200ms\n")
	_, host, up, cpu, iv, err := parse(f)
	if err != nil || *host != "pve1" || strings.Join(*up, " ") != "vmnic0=bond0 vmnic1=bond1" || !*cpu || *iv != 200*time.Millisecond {
		t.Errorf("from the file: %v host %q uplink %v cpu %v interval %v", err, *host, *up, *cpu, *iv)
	}
	_, host, up, _, _, err = parse(f, "--host", "pve2", "--uplink", "x=y")
	if err != nil || *host != "pve2" || strings.Join(*up, " ") != "x=y" {
		t.Errorf("the command line does not win: %v host %q uplink %v", err, *host, *up)
	}
	for _, c := range []struct{ text, want string }{
		{"host: h\nhots: h\n", "b.yaml:2: hots: not a flag of sluice agent (did you mean \"host\"?)"},
		{"interval: fast\n", "b.yaml:1: interval: parse error"},
		{"cpu: {a: 1}\n", "b.yaml:1: cpu: want a value or a list of values"},
		{"- host\n", "b.yaml:1: want flag: value lines"},
		{"config: x.yaml\n", "b.yaml:1: config: not a flag of sluice agent"},
	} {
		_, _, _, _, _, err := parse(write("b.yaml", c.text))
		if err == nil || !strings.HasSuffix(err.Error(), c.want) || !strings.HasPrefix(err.Error(), dir) {
			t.Errorf("%q: %v, want …%s", c.text, err, c.want)
		}
	}
	if _, _, _, _, _, err := parse(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("a missing --config: %v", err)
	}
	// No --config: the default file when it exists, else nothing.
	if _, host, _, _, _, err := parse(""); err != nil || *host != "" {
		t.Errorf("no default file: %v %q", err, *host)
	}
	write("agent.yaml", "host: pve9\n")
	if _, host, _, _, _, err := parse(""); err != nil || *host != "pve9" {
		t.Errorf("the default file: %v %q", err, *host)
	}
}
