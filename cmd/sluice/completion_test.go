package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCompletionBash: bash, with `sluice completion bash` sourced,
// completes commands, verbs and each command's flags (the inventory the
// --help test checks); zsh's script is bash's under bashcompinit.
func TestCompletionBash(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("the completion test needs bash")
	}
	var script, stderr bytes.Buffer
	if code := run([]string{"completion", "bash"}, &script, &stderr); code != exitOK {
		t.Fatalf("completion bash: exit %d %s", code, stderr.String())
	}
	file := filepath.Join(t.TempDir(), "sluice.bash")
	if err := os.WriteFile(file, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ line, want string }{
		{"sluice ag", "agent"},
		{"sluice co", "completion controller"},
		{"sluice lab ", "up down status"},
		{"sluice agent un", "uninstall"},
		{"sluice agent uninstall --ker", "--kernel-default"},
		{"sluice agent --host h1 --metr", "--metrics-listen"},
		{"sluice top --so", "--sort"},
		{"sluice ctl apply --rea", "--reason"},
		{"sluice place f.yaml --ch", "--change"},
		{"sluice gateway status -", "--dir --host -o"},
	} {
		words := strings.Split(c.line, " ")
		// COMP_WORDS as bash splits the line; the cursor on the last word.
		cmd := "source " + file + "; COMP_WORDS=(" + quoteWords(words) + "); COMP_CWORD=" + strconv.Itoa(len(words)-1) + "; _sluice; echo \"${COMPREPLY[*]}\""
		out, err := exec.Command("bash", "--norc", "--noprofile", "-c", cmd).CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != c.want {
			t.Errorf("%q: %q (%v), want %q", c.line, got, err, c.want)
		}
	}
	var zsh bytes.Buffer
	if code := run([]string{"completion", "zsh"}, &zsh, &stderr); code != exitOK || !strings.HasPrefix(zsh.String(), "#compdef sluice\n") || !strings.Contains(zsh.String(), "bashcompinit") {
		t.Errorf("completion zsh: exit %d\n%s", code, zsh.String())
	}
	if code := run([]string{"completion", "fish"}, &zsh, &stderr); code != exitUsage {
		t.Errorf("completion fish: exit %d, want %d", code, exitUsage)
	}
}

func quoteWords(ws []string) string {
	var q []string
	for _, w := range ws {
		q = append(q, "'"+w+"'")
	}
	return strings.Join(q, " ")
}
