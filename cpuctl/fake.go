package cpuctl

import (
	"fmt"
	"sort"
	"strings"
)

// Fake is a stateful stand-in for a cgroup v2 hierarchy, for unit tests of
// callers (the agent): Apply reconciles its files as V2 does and counts
// the writes; Stats returns what SetStats stored. String renders its whole
// state. A group must be added with AddGroup before Apply or Stats, as a
// real group must exist.
type Fake struct {
	groups map[string]*fakeGroup
	Writes int // files written since the Fake was made
}

type fakeGroup struct {
	files map[string]string
	stats Stats
}

// NewFake is an empty Fake.
func NewFake() *Fake { return &Fake{groups: map[string]*fakeGroup{}} }

// AddGroup creates group with the kernel's defaults (cpu.weight 100,
// cpu.max "max 100000").
func (f *Fake) AddGroup(group string) {
	f.groups[group] = &fakeGroup{files: map[string]string{"cpu.weight": "100", "cpu.max": "max 100000"}}
}

// SetStats sets what Stats returns for group.
func (f *Fake) SetStats(group string, s Stats) {
	if g := f.groups[group]; g != nil {
		g.stats = s
	}
}

// Apply reconciles cpu.weight and cpu.max.
func (f *Fake) Apply(group string, s Setting) ([]string, error) {
	g := f.groups[group]
	if g == nil {
		return nil, fmt.Errorf("cpuctl: fake: no group %s", group)
	}
	var written []string
	for _, fw := range [][2]string{{"cpu.weight", fmt.Sprint(s.Weight)}, {"cpu.max", s.CPUMax()}} {
		if g.files[fw[0]] != fw[1] {
			g.files[fw[0]] = fw[1]
			written = append(written, fw[0])
			f.Writes++
		}
	}
	return written, nil
}

// Stats returns what SetStats stored.
func (f *Fake) Stats(group string) (Stats, error) {
	g := f.groups[group]
	if g == nil {
		return Stats{}, fmt.Errorf("cpuctl: fake: no group %s", group)
	}
	return g.stats, nil
}

// String renders every group and its files, sorted, and the write count:
//
//	sl-c1-vm1 cpu.max="30000 100000" cpu.weight=3000
//	writes 2
func (f *Fake) String() string {
	var names []string
	for n := range f.groups {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		g := f.groups[n]
		fmt.Fprintf(&b, "%s cpu.max=%q cpu.weight=%s\n", n, g.files["cpu.max"], g.files["cpu.weight"])
	}
	fmt.Fprintf(&b, "writes %d\n", f.Writes)
	return b.String()
}
