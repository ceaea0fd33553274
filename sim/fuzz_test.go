package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseScenario feeds arbitrary bytes to the scenario parser. It must
// never panic, and a rejected input gives lines that each start with the
// file's name. The seeds are the scenarios of the repository.
func FuzzParseScenario(f *testing.F) {
	files, _ := filepath.Glob("../scenarios/*/*.yaml")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil && len(b) < 64<<10 {
			f.Add(b)
		}
	}
	f.Add([]byte("{0,1}")) // a type error of several lines (sim/testdata holds datadriven files only, so seeds live here)
	f.Add([]byte("name: x\nduration: 10s\npolicy:\n  cluster: c\n  hosts: [{name: h, uplinks: [{name: u, speed: 1Gbps}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := ParseScenario("f.yaml", data)
		if err != nil {
			if sc != nil {
				t.Fatal("scenario and error both returned")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "f.yaml") {
					t.Fatalf("message line without the file: %q", line)
				}
			}
		}
	})
}
