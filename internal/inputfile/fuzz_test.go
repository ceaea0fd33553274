package inputfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzReadJSON reads arbitrary state files: never a panic, and an error
// is one line that starts with the file's path.
func FuzzReadJSON(f *testing.F) {
	f.Add([]byte(`{"cluster":"lab","host":"h1","uplinks":[{"uplink":"u0","ports":[{"port":"vm1/nic0","bytes":12}]}]}`))
	f.Add([]byte(`{"a":[1,2,{"b":"\"x\\"}]}`))
	f.Add([]byte("{\n\"a\": tru\n}"))
	f.Add([]byte(`[[[[[[[[[[]]]]]]]]]]`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "state.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var into struct {
			Cluster string `json:"cluster"`
			Uplinks []struct {
				Ports []struct {
					Port  string `json:"port"`
					Bytes uint64 `json:"bytes"`
				} `json:"ports"`
			} `json:"uplinks"`
		}
		for _, v := range []any{&into, new(any)} {
			err := ReadJSON(path, 1<<16, v)
			if err == nil {
				continue
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, path) {
				t.Fatalf("error not one line starting with the path: %q", msg)
			}
		}
	})
}
