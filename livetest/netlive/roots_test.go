package netlive

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"sluice/agent"
)

// rootSpecs are roots an uplink may have before sluice takes it: every
// kind sluice gives back, bare and with its optional parameters (the
// first is the one of the issue: tbf with a peak rate, whose mtu an older
// sluice lost).
var rootSpecs = []string{
	"tbf rate 750mbit burst 96kb peakrate 900mbit mtu 3000 latency 33ms",
	"tbf rate 500mbit burst 256k latency 20ms",
	"tbf rate 100mbit burst 32k limit 100000",
	"tbf rate 10gbit burst 1mb peakrate 12gbit minburst 9000 limit 2000000",
	"htb",
	"htb default 10 r2q 20 direct_qlen 500",
	"pfifo", "pfifo limit 300",
	"bfifo", "bfifo limit 30000",
	"pfifo_head_drop limit 50",
	"pfifo_fast",
	"fq", "fq limit 5000 flow_limit 50 quantum 3028 initial_quantum 15140 maxrate 1gbit",
	"fq_codel", "fq_codel limit 2000 flows 512 target 3ms interval 50ms quantum 1600 ecn ce_threshold 2ms memory_limit 16Mb",
	"sfq", "sfq perturb 10 quantum 3000 limit 64 divisor 512",
	"prio", "prio bands 5 priomap 0 1 2 3 4 0 0 0 0 0 0 0 0 0 0 0",
	"codel", "codel limit 500 target 4ms interval 80ms ecn",
}

// refusedSpecs are roots sluice cannot give back whole, refused before it
// changes anything (setup commands after the root's).
var refusedSpecs = []struct {
	root  string
	setup [][]string
	why   string
}{
	{"htb", [][]string{{"class", "add", "dev", "DEV", "parent", "7:", "classid", "7:1", "htb", "rate", "1gbit"}}, "classes are defined in it"},
	{"tbf rate 1gbit burst 64k latency 10ms", [][]string{{"qdisc", "add", "dev", "DEV", "parent", "7:1", "handle", "8:", "pfifo"}}, "qdiscs are attached below it"},
	{"htb", [][]string{{"filter", "add", "dev", "DEV", "parent", "7:", "protocol", "all", "u32", "match", "u32", "0", "0", "classid", "7:1"}}, "filters are attached to it"},
	{"red limit 400000 min 30000 max 90000 avpkt 1000 burst 55 bandwidth 100mbit", nil, "gives back only roots of kinds"},
	{"netem delay 10ms", nil, "gives back only roots of kinds"},
}

// TestRootRoundTrip: for every root of rootSpecs that this kernel has, on
// a veth in an sl- namespace, sluice records the root, replaces it with
// its HTB and gives it back: `tc -j -d qdisc show` is the same before and
// after. Roots that could not be given back whole are refused before any
// change (CheckRestorable). Kinds the kernel lacks are logged and skipped.
func TestRootRoundTrip(t *testing.T) {
	requireLive(t)
	ns := fmt.Sprintf("sl-roots-%d", os.Getpid())
	run := func(args ...string) (string, error) {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("%s: %v %s", strings.Join(args, " "), err, out)
		}
		return out
	}
	tc := func(args ...string) (string, error) {
		return run(append([]string{"ip", "netns", "exec", ns, "tc"}, args...)...)
	}
	_, _ = run("ip", "netns", "del", ns)
	must("ip", "netns", "add", ns)
	t.Cleanup(func() { _, _ = run("ip", "netns", "del", ns) })
	must("ip", "-n", ns, "link", "add", "sl-rt0", "type", "veth", "peer", "name", "sl-rt1")
	must("ip", "-n", ns, "link", "set", "sl-rt0", "up")
	must("ip", "-n", ns, "link", "set", "sl-rt1", "up")
	k, err := agent.NewNetlinkKernel(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	show := func() string {
		t.Helper()
		out, err := tc("-j", "-d", "qdisc", "show", "dev", "sl-rt0")
		if err != nil {
			t.Fatalf("tc qdisc show: %v %s", err, out)
		}
		return out
	}
	reset := func() { _, _ = tc("qdisc", "del", "dev", "sl-rt0", "root") }
	var done, missing []string
	for _, spec := range rootSpecs {
		reset()
		if out, err := tc(append([]string{"qdisc", "add", "dev", "sl-rt0", "root", "handle", "7:"}, strings.Fields(spec)...)...); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", spec, strings.TrimSpace(out)))
			continue
		}
		before := show()
		q, err := k.RootQdisc("sl-rt0")
		if err != nil {
			t.Fatalf("%s: RootQdisc: %v", spec, err)
		}
		if err := agent.CheckRestorable(q); err != nil {
			t.Errorf("%s: refused: %v", spec, err)
			continue
		}
		if err := k.ReplaceRootHTB("sl-rt0", 0x10); err != nil {
			t.Fatalf("%s: ReplaceRootHTB: %v", spec, err)
		}
		if cur, _ := k.RootQdisc("sl-rt0"); !cur.IsSluice() {
			t.Fatalf("%s: sluice's root not in place: %+v", spec, cur)
		}
		if err := k.RestoreRoot("sl-rt0", q); err != nil {
			t.Errorf("%s: RestoreRoot: %v", spec, err)
			continue
		}
		if after := show(); after != before {
			t.Errorf("%s: after the round trip\n%s\nbefore\n%s", spec, after, before)
			continue
		}
		done = append(done, spec)
	}
	t.Logf("given back as they were (%d): %s", len(done), strings.Join(done, "; "))
	if len(missing) > 0 {
		t.Logf("not in this kernel, skipped (%d): %s", len(missing), strings.Join(missing, "; "))
	}
	for _, r := range refusedSpecs {
		reset()
		if out, err := tc(append([]string{"qdisc", "add", "dev", "sl-rt0", "root", "handle", "7:"}, strings.Fields(r.root)...)...); err != nil {
			t.Logf("not in this kernel, skipped: %s (%s)", r.root, strings.TrimSpace(out))
			continue
		}
		skip := false
		for _, s := range r.setup {
			args := strings.Fields(strings.ReplaceAll(strings.Join(s, " "), "DEV", "sl-rt0"))
			if out, err := tc(args...); err != nil {
				t.Logf("%s: setup %v failed, skipped: %s", r.root, args, strings.TrimSpace(out))
				skip = true
			}
		}
		if skip {
			continue
		}
		q, err := k.RootQdisc("sl-rt0")
		if err != nil {
			t.Fatal(err)
		}
		err = agent.CheckRestorable(q)
		if err == nil || !strings.Contains(err.Error(), r.why) {
			t.Errorf("%s %v: CheckRestorable %v, want an error with %q", r.root, r.setup, err, r.why)
			continue
		}
		t.Logf("refused: %v", err)
	}
}
