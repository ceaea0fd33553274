package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/agent"
)

// badCase is one bad command line: the exit code it must give, the file
// every line of stderr must name (with ":LINE:" when line > 0) and how
// many lines stderr must have.
type badCase struct {
	name  string
	args  []string
	code  int
	file  string // "" for usage errors
	line  int    // 0: the problem has no line
	lines int    // stderr lines; 0 means 1
}

// TestBadInput runs sluice over bad input, in process: every case exits 1
// (2 only for usage errors) with one line per problem naming the file (and
// line), no panic text, in bounded time and memory.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const hosts = "cluster: c\nhosts:\n  - name: h1\n    uplinks: [{name: u, speed: 10Gbps}]\n"
	const vm = "vms:\n  - name: v1\n    host: h1\n    nics: [{name: n0, "
	digits := strings.Repeat("1", 5_000_000)

	// Policy files: contents and the line of their one problem.
	policies := []struct {
		name, text string
		line       int
	}{
		{"syntax", "cluster: [\n", 1},
		{"tab", "cluster: c\n\thosts: []\n", 2},
		{"empty", "", 1},
		{"comments", "# nothing\n", 1},
		{"nul", "cluster: c\x00\n", 1},
		{"utf8", "cluster: \xff\xfe\n", 1},
		{"list", "- a\n- b\n", 1},
		{"scalar", "hello\n", 1},
		{"twodocs", hosts + "---\ncluster: d\n", 5},
		{"anchor", hosts + "vms: &a []\n", 5},
		{"alias", "cluster: &c x\nhosts: *c\n", 1},
		{"unknownfield", hosts + "clster: x\n", 5},
		{"nohosts", "cluster: c\n", 1},
		{"emptyhosts", "cluster: c\nhosts: []\n", 2},
		{"hostsscalar", "cluster: c\nhosts: 5\n", 2},
		{"badunit", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: 10Gbs}]}]\n", 2},
		{"negative", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: -1Gbps}]}]\n", 2},
		{"nounit", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: 10}]}]\n", 2},
		{"hugerate", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: 1e99Gbps}]}]\n", 2},
		{"longrate", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: " + strings.Repeat("1", 70) + "Gbps}]}]\n", 2},
		{"millionrate", "cluster: c\nhosts: [{name: h, uplinks: [{name: u, speed: " + digits + "Gbps}]}]\n", 2},
		{"millionfraction", "cluster: c\nreservationCap: 0." + digits + "\n" + hosts[11:], 2},
		{"millionshares", hosts + vm + "shares: " + digits + "}]\n", 8},
		{"badshares", hosts + vm + "shares: hihg}]\n", 8},
		{"sharesrange", hosts + vm + "shares: 99999999}]\n", 8},
		{"zerolimit", hosts + vm + "limit: 0}]\n", 8},
		{"resoverlimit", hosts + vm + "reservation: 2Gbps, limit: 1Gbps}]\n", 8},
		{"unknownnicfield", hosts + vm + "reservaton: 1Gbps}]\n", 8},
		{"dupehost", hosts + "  - name: h1\n    uplinks: [{name: u, speed: 1Gbps}]\n", 5},
		{"unknownhost", hosts + "vms: [{name: v1, host: h2}]\n", 5},
		{"unknownpg", hosts + "portGroups: [{name: a}]\n" + vm + "portGroup: b}]\n", 9},
		{"badname", "cluster: 'a b'\nhosts: [{name: h, uplinks: [{name: u, speed: 1Gbps}]}]\n", 1},
		{"longname", "cluster: " + strings.Repeat("a", 100_000) + "\nhosts: [{name: h, uplinks: [{name: u, speed: 1Gbps}]}]\n", 1},
		{"longkey", hosts + strings.Repeat("k", 1_000_000) + ": 1\n", 5},
		{"flowdepth", "cluster: c\nhosts: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\n", 2},
		{"flowdepth100k", "cluster: c\nhosts: " + strings.Repeat("[", 100_000) + "\n", 2},
		{"blockdepth", "cluster: c\nhosts:\n" + blockNest(40), 0},
		{"dashes", "cluster: c\nhosts: " + strings.Repeat("- ", 300_000) + "\n", 2},
		{"toomanyhosts", "cluster: c\nhosts:\n" + strings.Repeat("  - {name: h, uplinks: [{name: u, speed: 1Gbps}]}\n", 1001), 3},
		{"toomanyuplinks", "cluster: c\nhosts: [{name: h, uplinks: [" + strings.Repeat("{name: u, speed: 1Gbps},", 65) + "]}]\n", 2},
		{"ones6MB", "cluster: c\nhosts: [" + strings.Repeat("1, ", 2_000_000) + "1]\n", 2},
		{"empties6MB", "cluster: c\nhosts: [" + strings.Repeat("{}, ", 1_500_000) + "{}]\n", 2},
		{"vms120k", hosts + "vms:\n" + strings.Repeat("  - {name: v, host: hx}\n", 120_000), 0},
		{"cores", "cluster: c\nhosts: [{name: h, cpu: {cores: 99999999}, uplinks: [{name: u, speed: 1Gbps}]}]\n", 2},
		{"cpuscalar", "cluster: c\nhosts: [{name: h, cpu: 5, uplinks: [{name: u, speed: 1Gbps}]}]\n", 2},
		{"mergekey", hosts + "<<: {a: 1}\n", 5},
		{"complexkey", hosts + "? [a]\n: 1\n", 5},
		{"bool", hosts + "vms: [{name: v, host: h1, migratable: maybe}]\n", 5},
	}
	var cases []badCase
	one := func(c badCase) { cases = append(cases, c) }
	for _, pc := range policies {
		f := write("p-"+pc.name+".yaml", pc.text)
		line := pc.line
		cmds := [][]string{{"validate", f}, {"place", f}}
		if len(pc.text) < 1<<20 { // the big ones twice are enough
			cmds = append(cmds, []string{"alloc", f}, []string{"explain", f, "v1/n0"},
				[]string{"agent", "status", "--host", "h1", "--policy", f, "--state-dir", dir},
				[]string{"lab", "status", f, "--state-dir", dir})
		}
		for _, args := range cmds {
			one(badCase{name: pc.name + "/" + args[0], args: args, code: exitBad, file: f, line: line})
		}
	}

	// A policy over the size cap (8.4 MB of hosts: [1, 1, …]), sparse
	// files far over it, and files that are not regular.
	big := write("big.yaml", "cluster: c\nhosts: ["+strings.Repeat("1, ", 2_800_000)+"1]\n")
	sparse := filepath.Join(dir, "sparse.yaml")
	if f, err := os.Create(sparse); err == nil {
		f.Truncate(1 << 40)
		f.Close()
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	subdir := filepath.Join(dir, "subdir.yaml")
	os.Mkdir(subdir, 0o755)
	missing := filepath.Join(dir, "missing.yaml")
	for _, f := range []string{big, sparse, fifo, subdir, missing, "/dev/zero", "/dev/null", "/dev/urandom"} {
		for _, args := range [][]string{
			{"validate", f}, {"alloc", f}, {"explain", f, "v1/n0"}, {"place", f}, {"sim", f},
			{"lab", "status", f, "--state-dir", dir}, {"agent", "--host", "h1", "--policy", f},
			{"agent", "status", "--host", "h1", "--policy", f, "--state-dir", dir},
			{"gateway", "--host", "h1", "--policy", f, "--listen", "unix:" + filepath.Join(dir, "gw.sock")},
		} {
			one(badCase{name: filepath.Base(f) + "/" + args[0], args: args, code: exitBad, file: f})
		}
	}
	// Many problems: at most 100 lines and one counting the rest; the
	// suggestions of the others are never computed.
	many := write("many.yaml", "cluster: c\nhosts:\n"+
		strings.Repeat("  - {name: h, uplinks: [{name: u, speed: 1Gbps}]}\n", 1)+"vms:\n"+vmsNamingHost(30_000, "hx"))
	one(badCase{name: "30k-mistyped-hosts", args: []string{"validate", many}, code: exitBad, file: many, line: 5, lines: 101})

	// State files of the agent and the gateway.
	for _, st := range []struct {
		name, text string
		line       int
	}{
		{"syntax", "{\n\"host\": ", 2},
		{"type", "{\"host\": 5}", 1},
		{"empty", "", 1},
		{"values", "{\"uplinks\": [" + strings.Repeat("{},", 300_000) + "{}]}", 1},
		{"binary", "\x00\x01\x02", 1},
	} {
		ad := filepath.Join(dir, "agent-"+st.name)
		os.Mkdir(ad, 0o755)
		af := agent.StatsPath(ad, "c", "h1")
		os.WriteFile(af, []byte(st.text), 0o644)
		one(badCase{name: "agentstate-" + st.name, args: []string{"agent", "status", "--host", "h1", "--state-dir", ad}, code: exitBad, file: af, line: st.line})
		gd := filepath.Join(dir, "gw-"+st.name)
		os.Mkdir(gd, 0o755)
		gf := filepath.Join(gd, "gateway-c-h1.json")
		os.WriteFile(gf, []byte(st.text), 0o644)
		one(badCase{name: "gwstate-" + st.name, args: []string{"gateway", "status", "--dir", gd}, code: exitBad, file: gf, line: st.line})
	}
	for _, kind := range []string{"fifo", "dir", "sparse"} {
		ad := filepath.Join(dir, "agent-"+kind)
		os.Mkdir(ad, 0o755)
		af := agent.StatsPath(ad, "c", "h1")
		gd := filepath.Join(dir, "gw-"+kind)
		os.Mkdir(gd, 0o755)
		gf := filepath.Join(gd, "gateway-c-h1.json")
		for _, p := range []string{af, gf} {
			switch kind {
			case "fifo":
				syscall.Mkfifo(p, 0o644)
			case "dir":
				os.Mkdir(p, 0o755)
			case "sparse":
				f, _ := os.Create(p)
				f.Truncate(1 << 40)
				f.Close()
			}
		}
		one(badCase{name: "agentstate-" + kind, args: []string{"agent", "status", "--host", "h1", "--state-dir", ad}, code: exitBad, file: af})
		one(badCase{name: "gwstate-" + kind, args: []string{"gateway", "status", "--dir", gd}, code: exitBad, file: gf})
	}

	// Scenario files.
	const pol = "policy:\n  cluster: c\n  hosts: [{name: h1, uplinks: [{name: u, speed: 1Gbps}]}]\n"
	for _, sc := range []struct {
		name, text string
		line       int
	}{
		{"syntax", "name: [\n", 1},
		{"unknownfield", "name: x\nbogus: 1\n" + pol, 2},
		{"nopolicy", "name: x\n", 1},
		{"longduration", "name: x\nduration: 1000000h\n" + pol, 2},
		{"tinysample", "name: x\nduration: 600s\nsample: 1ns\n" + pol, 3},
		{"badduration", "name: x\nduration: soon\n" + pol, 1},
		{"policyfifo", "name: x\npolicy: fifo.yaml\n", 0},
		{"policydir", "name: x\npolicy: subdir.yaml\n", 0},
		{"policyzero", "name: x\npolicy: /dev/zero\n", 0},
		{"policybig", "name: x\npolicy: big.yaml\n", 0},
		{"inlinebad", "name: x\npolicy:\n  cluster: c\n  hosts: [{name: h1, uplinks: [{name: u, speed: 1Gbs}]}]\n", 4},
		{"values", "name: x\nworkloads: [" + strings.Repeat("{}, ", 300_000) + "{}]\n", 2},
		{"workloadtype", "name: x\n" + pol + "workloads: [{name: w, type: warp, port: a/b}]\n", 5},
		{"millionrate", "name: x\n" + pol + "workloads: [{name: w, type: bulk, port: v/n, rate: " + digits + "Gbps}]\n", 0},
	} {
		f := write("s-"+sc.name+".yaml", sc.text)
		one(badCase{name: "scenario-" + sc.name, args: []string{"sim", f, "-o", filepath.Join(dir, "out")}, code: exitBad, file: f, line: sc.line})
	}

	// Command-line values.
	pf := "../../examples/netioc-fig2.yaml"
	for _, a := range [][]string{
		{"alloc", pf, "--demand", "vm1/nic0=" + digits + "Gbps"},
		{"alloc", pf, "--demand", "vm1/nic0=10Gbs"},
		{"place", pf, "--change", "vm1/nic0.reservation=" + digits + "Gbps"},
		{"place", pf, "--change", "vmx/nic0.reservation=1Gbps"},
		{"explain", pf, "nosuch/port"},
	} {
		one(badCase{name: "value-" + a[0], args: a, code: exitBad})
	}
	// Genuine usage errors: exit 2.
	for _, a := range [][]string{
		{"bogus"}, {"validate"}, {"validate", "a", "b"}, {"alloc"}, {"explain", pf}, {"place"},
		{"place", pf, "--threshold", "9"}, {"place", pf, "--change", "nonsense"}, {"sim"}, {"sim", "--bogus"},
		{"lab"}, {"lab", "sideways", pf}, {"agent"}, {"agent", "--bogus"}, {"agent", "status"},
		{"gateway"}, {"gateway", "--bogus"}, {"gateway", "status", "-o", "xml"}, {"version", "x"},
	} {
		one(badCase{name: "usage-" + strings.Join(a, "_"), args: a, code: exitUsage})
	}

	if len(cases) < 150 {
		t.Fatalf("only %d cases", len(cases))
	}
	start := time.Now()
	var ms runtime.MemStats
	var maxAlloc uint64
	for _, c := range cases {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		var stdout, stderr bytes.Buffer
		done := make(chan int, 1)
		t0 := time.Now()
		go func() { done <- run(c.args, &stdout, &stderr) }()
		var code int
		select {
		case code = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: sluice %s did not return within 10 s", c.name, clipArgs(c.args))
		}
		runtime.ReadMemStats(&ms)
		alloc := ms.TotalAlloc - before
		maxAlloc = max(maxAlloc, alloc)
		checkBad(t, c, code, stdout.String(), stderr.String(), time.Since(t0), alloc)
	}
	t.Logf("%d bad inputs in %s; at most %d MB allocated by one", len(cases), time.Since(start).Round(time.Millisecond), maxAlloc>>20)
}

// checkBad reports how a case's outcome breaks the rules.
func checkBad(t *testing.T, c badCase, code int, stdout, stderr string, took time.Duration, alloc uint64) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	want := c.lines
	if want == 0 {
		want = 1
	}
	fail := func(format string, a ...any) {
		t.Errorf("%s: sluice %s: %s\nstderr: %.600s", c.name, clipArgs(c.args), fmt.Sprintf(format, a...), stderr)
	}
	switch {
	case code != c.code:
		fail("exit %d, want %d", code, c.code)
	case stderr == "":
		fail("nothing on stderr")
	case strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") || strings.Contains(stderr, "internal error"):
		fail("panic text")
	case c.code == exitBad && len(lines) != want:
		fail("%d lines on stderr, want %d", len(lines), want)
	case took > 5*time.Second:
		fail("took %s", took)
	case alloc > 200<<20:
		fail("allocated %d MB", alloc>>20)
	}
	if c.file == "" {
		return
	}
	for _, l := range lines {
		if !strings.Contains(l, c.file) {
			fail("a line without the file name: %.200s", l)
			return
		}
		if len(l) > 1000 {
			fail("a line of %d bytes", len(l))
			return
		}
	}
	if c.line > 0 && !strings.Contains(lines[0], fmt.Sprintf("%s:%d:", c.file, c.line)) {
		fail("first line does not name %s:%d:", filepath.Base(c.file), c.line)
	}
}

func clipArgs(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// blockNest is n levels of block lists, each a level deeper.
func blockNest(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(strings.Repeat("  ", i+1) + "-\n")
	}
	b.WriteString(strings.Repeat("  ", n+1) + "- x\n")
	return b.String()
}

// vmsNamingHost is n VMs in block style on host.
func vmsNamingHost(n int, host string) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {name: v%d, host: %s}\n", i, host)
	}
	return b.String()
}

// TestHelp: every command's -h and --help print its usage and an example
// to stdout and exit 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"agent"}, {"agent", "status"}, {"gateway"}, {"gateway", "status"}, {"sim"}, {"place"},
		{"lab"}, {"alloc"}, {"explain"}, {"validate"}, {"version"}, {"top"},
	} {
		for _, h := range []string{"-h", "--help"} {
			var stdout, stderr bytes.Buffer
			code := run(append(append([]string{}, args...), h), &stdout, &stderr)
			out := stdout.String()
			if code != exitOK || stderr.Len() > 0 || !strings.HasPrefix(out, "usage: sluice "+strings.Join(args, " ")) || !strings.Contains(out, "\nexample:\n  sluice "+args[0]) {
				t.Errorf("sluice %s %s: exit %d\nstdout %q\nstderr %q", strings.Join(args, " "), h, code, out, stderr.String())
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"place", "--help"}, &stdout, &stderr); code != exitOK || !strings.Contains(stdout.String(), "HOST/UPLINK.down") {
		t.Errorf("place --help lacks the change grammar: %q", stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"version"}, &stdout, &stderr); code != exitOK || !strings.HasPrefix(stdout.String(), "sluice ") {
		t.Errorf("version: exit %d %q", code, stdout.String())
	}
}
