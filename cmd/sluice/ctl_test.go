package main

import (
	"bytes"
	"strings"
	"testing"

	"sluice/controller"
)

func TestCtlHelp(t *testing.T) {
	for _, args := range [][]string{{"controller"}, {"ctl"}, {"ctl", "apply"}, {"ctl", "get"}, {"ctl", "set"}, {"ctl", "what-if"}, {"ctl", "explain"}, {"ctl", "power-on"}, {"ctl", "migrate"}, {"ctl", "approve"}, {"ctl", "token"}} {
		var stdout, stderr bytes.Buffer
		code := run(append(append([]string{}, args...), "--help"), &stdout, &stderr)
		out := stdout.String()
		if code != exitOK || stderr.Len() > 0 || !strings.HasPrefix(out, "usage: sluice "+strings.Join(args, " ")) || !strings.Contains(out, "\nexample:\n  sluice "+args[0]) {
			t.Errorf("sluice %s --help: exit %d\nstdout %q\nstderr %q", strings.Join(args, " "), code, out, stderr.String())
		}
	}
}

// TestCtlUsage: every malformed command line is one line and exit 2,
// before any connection is tried.
func TestCtlUsage(t *testing.T) {
	for _, args := range [][]string{
		{"ctl"}, {"ctl", "frobnicate"}, {"ctl", "apply"}, {"ctl", "get"}, {"ctl", "get", "things"},
		{"ctl", "set", "vm1/nic0"}, {"ctl", "set", "vm1/nic0", "reservation"}, {"ctl", "what-if"}, {"ctl", "explain"},
		{"ctl", "power-on"}, {"ctl", "migrate", "vm1"}, {"ctl", "approve"}, {"ctl", "approve", "x"}, {"ctl", "approve", "0"},
		{"controller", "--drs", "sometimes"}, {"controller", "--rebalance-threshold", "9"}, {"ctl", "get", "vms", "-o", "yaml"},
		{"ctl", "get", "vms", "--bogus"}, {"ctl", "get", "vms", "--server"}, {"ctl", "get", "events", "--after", "x"},
		{"controller", "--bogus"}, {"controller", "extra"}, {"controller", "--host-ttl", "0"}, {"controller", "--etcd-ca", "ca.pem"}, {"controller", "--max-events", "0"}, {"controller", "--event-ttl", "-1s"}, {"controller", "--listen", "nope"},
		{"controller", "--max-conns", "0"}, {"controller", "--max-conns-per-addr", "0"}, {"controller", "--max-conns", "10", "--max-conns-per-addr", "20"},
		{"controller", "--host-seats", "0"}, {"controller", "--operator-seats", "-1"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != exitUsage || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("sluice %s: exit %d, stderr %q", strings.Join(args, " "), code, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"ctl", "--token-file", "/nonexistent", "get", "vms"}, &stdout, &stderr); code != exitBad || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("missing token file: exit %d %q", code, stderr.String())
	}
}

// TestCtlToken: ctl token HOST prints a tokens-file line that acts as
// HOST only, a new token each time; a name that cannot be a host is one
// line and exit 2.
func TestCtlToken(t *testing.T) {
	var lines []string
	for range 2 {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"ctl", "token", "h1"}, &stdout, &stderr); code != exitOK || stderr.Len() > 0 {
			t.Fatalf("ctl token h1: exit %d %q", code, stderr.String())
		}
		lines = append(lines, strings.TrimSpace(stdout.String()))
	}
	toks, err := controller.ParseTokens([]byte(lines[0]))
	tok, _, _ := strings.Cut(lines[0], " ")
	if id, ok := toks.Lookup(tok); err != nil || !ok || id.Host != "h1" || len(tok) != 64 || lines[0] == lines[1] {
		t.Errorf("ctl token h1: %q, %q: %v", lines[0], lines[1], err)
	}
	for _, bad := range []string{"a/b", "", "h1 host=h2"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"ctl", "token", bad}, &stdout, &stderr); code != exitUsage || stdout.Len() > 0 || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("ctl token %q: exit %d %q %q", bad, code, stdout.String(), stderr.String())
		}
	}
}

func TestSetChanges(t *testing.T) {
	got, err := setChanges("vm1/disk0", []string{"iops=500", "limit=1000"})
	if err != nil || strings.Join(got, " ") != "vm1/disk0.reservation=500 vm1/disk0.limit=1000" {
		t.Fatalf("%v %v", got, err)
	}
	got, _ = setChanges("vm1", []string{"cpu=2000MHz", "memory=8GiB"})
	if strings.Join(got, " ") != "vm1.cpu.reservation=2000MHz vm1.memory=8GiB" {
		t.Fatalf("%v", got)
	}
}
