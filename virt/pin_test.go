package virt

import (
	"fmt"
	"testing"
)

// TestCPUMap: libvirt's CPU maps, CPU i at bit i%8 of byte i/8, both ways.
func TestCPUMap(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		n    int
		want string
	}{
		{[]int{1}, 2, "[2]"},
		{[]int{0, 3}, 4, "[9]"},
		{[]int{0, 8, 9}, 12, "[1 3]"},
		{[]int{2}, 2, "error"},
		{nil, 2, "error"},
	} {
		m, err := cpuMap(tc.cpus, tc.n)
		got := fmt.Sprint(m)
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("cpuMap(%v, %d) = %s (%v), want %s", tc.cpus, tc.n, got, err, tc.want)
		}
		if err == nil {
			if back := parseCPUMap(m, tc.n); fmt.Sprint(back) != fmt.Sprint(tc.cpus) {
				t.Errorf("parseCPUMap(%v) = %v, want %v", m, back, tc.cpus)
			}
		}
	}
}
