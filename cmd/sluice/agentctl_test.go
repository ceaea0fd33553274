package main

import (
	"strings"
	"testing"
)

func TestAgentControllerUsage(t *testing.T) {
	for _, args := range [][]string{
		{"agent", "--host", "h1"},
		{"agent", "--host", "h1", "--policy", "x.yaml", "--controller", "https://127.0.0.1:1"},
	} {
		var out, errb strings.Builder
		if code := run(args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d %q", args, code, errb.String())
		}
	}
	var out, errb strings.Builder
	if code := run([]string{"agent", "--host", "h1", "--controller", "https://127.0.0.1:1"}, &out, &errb); code != exitBad || !strings.Contains(errb.String(), "--token-file") {
		t.Errorf("no token: exit %d %q", code, errb.String())
	}
}
