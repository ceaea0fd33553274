package controller

import (
	"os"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestOpenAPI checks that api/openapi.yaml describes every route the
// handler serves (the routes of TestUnauthorized), and no other.
func TestOpenAPI(t *testing.T) {
	b, err := os.ReadFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var described, served []string
	for p, ops := range doc.Paths {
		for m := range ops {
			described = append(described, strings.ToUpper(m)+" "+p)
		}
	}
	for _, r := range routes {
		if strings.Contains(r.path, "no-such-route") {
			continue
		}
		p, _, _ := strings.Cut(r.path, "?")
		p = strings.NewReplacer("/vms/vm3/", "/vms/{vm}/", "/vms/vm2/", "/vms/{vm}/", "/hosts/h1/", "/hosts/{host}/", "/decisions/1/", "/decisions/{seq}/").Replace(p)
		served = append(served, r.method+" "+p)
	}
	sort.Strings(described)
	sort.Strings(served)
	if strings.Join(described, "\n") != strings.Join(served, "\n") {
		t.Fatalf("api/openapi.yaml:\n%s\nserved:\n%s", strings.Join(described, "\n"), strings.Join(served, "\n"))
	}
}
