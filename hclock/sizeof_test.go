package hclock

import (
	"testing"
	"unsafe"
)

// TestNodeSize keeps the hot node state at two cache lines.
func TestNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(node{}); n != 128 {
		t.Errorf("node is %d bytes, want 128 (two cache lines)", n)
	}
}
