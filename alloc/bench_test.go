package alloc

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"sluice/internal/cputime"
)

// benchLeaf makes a consumer with the mix a busy uplink sees: one in ten
// reserves, one in five is limited, half have a finite demand (so that
// water-filling has breakpoints to sort), shares 25–100.
func benchLeaf(r *rand.Rand, i int, scale float64) *Node {
	n := &Node{Name: fmt.Sprintf("c%d", i), Shares: float64(25 + r.IntN(76)), Limit: Inf, Demand: Inf}
	if r.IntN(10) == 0 {
		n.Reservation = r.Float64() * scale
	}
	if r.IntN(5) == 0 {
		n.Limit = n.Reservation + r.Float64()*5*scale
	}
	if r.IntN(2) == 0 {
		n.Demand = r.Float64() * 4 * scale
	}
	return n
}

// flatTree is one uplink with n ports (capacity chosen so that about half
// the demand is met: every bound is exercised).
func flatTree(n int, sem Semantics) (*Node, float64) {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	root := &Node{Name: "uplink", Limit: Inf, Demand: Inf, Semantics: sem}
	for i := 0; i < n; i++ {
		root.Children = append(root.Children, benchLeaf(r, i, 1e6))
	}
	return root, float64(n) * 1e6
}

// threeLevel is root → a → b → leaves with fan-outs a, b, c (n = a·b·c
// consumers): e.g. uplinks → classes → vNICs at data-centre scale.
func threeLevel(a, b, c int, sem Semantics) (*Node, float64) {
	r := rand.New(rand.NewPCG(2, uint64(a*b*c)))
	root := &Node{Name: "root", Limit: Inf, Demand: Inf, Semantics: sem}
	id := 0
	for i := 0; i < a; i++ {
		l1 := &Node{Name: fmt.Sprintf("l1-%d", i), Shares: float64(25 + r.IntN(76)), Limit: Inf, Reservation: float64(b*c) * 1e5, Semantics: sem}
		for j := 0; j < b; j++ {
			l2 := &Node{Name: fmt.Sprintf("l2-%d", j), Shares: float64(25 + r.IntN(76)), Limit: Inf, Semantics: sem}
			for k := 0; k < c; k++ {
				l2.Children = append(l2.Children, benchLeaf(r, id, 1e6))
				id++
			}
			l1.Children = append(l1.Children, l2)
		}
		root.Children = append(root.Children, l1)
	}
	return root, float64(a*b*c) * 1e6
}

func benchCompute(b *testing.B, root *Node, capacity float64, consumers int) {
	var s Solver
	s.Compute(root, capacity) // grow scratch
	b.ReportAllocs()
	c0 := cputime.ProcessNs()
	for b.Loop() {
		s.Compute(root, capacity)
	}
	cpu := float64(cputime.ProcessNs()-c0) / float64(b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(consumers), "ns/consumer")
	b.ReportMetric(cpu, "cpu-ns/op")
	b.ReportMetric(cpu/float64(consumers), "cpu-ns/consumer")
}

// BenchmarkUplink1000 is one uplink with 1,000 ports (target ≤ 100 µs/op).
func BenchmarkUplink1000(b *testing.B) {
	for _, sem := range []Semantics{Additive, Floor} {
		b.Run(sem.String(), func(b *testing.B) {
			root, c := flatTree(1000, sem)
			benchCompute(b, root, c, 1000)
		})
	}
}

// BenchmarkTree100k is a 3-level tree of 100,000 consumers, 10 × 100 × 100
// (target ≤ 30 ms/op).
func BenchmarkTree100k(b *testing.B) {
	for _, sem := range []Semantics{Additive, Floor} {
		b.Run(sem.String(), func(b *testing.B) {
			root, c := threeLevel(10, 100, 100, sem)
			benchCompute(b, root, c, 100000)
		})
	}
}

// BenchmarkScaling shows how the cost per consumer grows with n, for one
// flat level (sorting k breakpoints: k log k) and for three levels of equal
// fan-out.
func BenchmarkScaling(b *testing.B) {
	for _, n := range []int{100, 1000, 10000, 100000, 1000000} {
		b.Run(fmt.Sprintf("flat/n=%d", n), func(b *testing.B) {
			root, c := flatTree(n, Additive)
			benchCompute(b, root, c, n)
		})
	}
	for _, f := range []int{5, 10, 22, 46, 100} {
		n := f * f * f
		b.Run(fmt.Sprintf("3level/n=%d", n), func(b *testing.B) {
			root, c := threeLevel(f, f, f, Additive)
			benchCompute(b, root, c, n)
		})
	}
}

// TestZeroAllocs asserts that a Solver reused on a prepared tree allocates
// nothing per call, for both semantics, flat and deep.
func TestZeroAllocs(t *testing.T) {
	for _, sem := range []Semantics{Additive, Floor} {
		for name, mk := range map[string]func() (*Node, float64){
			"flat":   func() (*Node, float64) { return flatTree(1000, sem) },
			"3level": func() (*Node, float64) { return threeLevel(5, 10, 20, sem) },
		} {
			root, c := mk()
			var s Solver
			if n := testing.AllocsPerRun(20, func() { s.Compute(root, c) }); n != 0 {
				t.Errorf("%s %s: %v allocations per Compute, want 0", sem, name, n)
			}
			if v := Check(root, c, 1e-9*c); len(v) > 0 {
				t.Errorf("%s %s: %v", sem, name, v)
			}
		}
	}
}
