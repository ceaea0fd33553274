package nicinfo

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var record = flag.Bool("record", false, "TestReadLive: write the kernel's replies to testdata/*.hex for the parsing tests")

// TestReadLive (root) reads a veth, a tap, the loopback device and, where
// the kernel has the driver, an IFB in a fresh sl- network namespace and
// compares every field with the ethtool CLI as the oracle (ethtool -i,
// ethtool DEV's speed and duplex, -l, -k) and with ip -d link's queue
// counts. Then it turns GSO off on the veth (ethtool -K) and checks that
// the Reader sees it off and that the warning names it.
func TestReadLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestReadLive needs root (a network namespace, a tap device, ethtool -K); run it as root")
	}
	for _, tool := range []string{"ip", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: scripts/deps.sh installs it", tool)
		}
	}
	ns := fmt.Sprintf("sl-nic%d-host", os.Getpid()%100000)
	run := func(args ...string) (string, error) {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return out
	}
	_, _ = run("ip", "netns", "del", ns)
	must("ip", "netns", "add", ns)
	t.Cleanup(func() { _, _ = run("ip", "netns", "del", ns) })
	must("ip", "-n", ns, "link", "add", "sl-nv0", "type", "veth", "peer", "name", "sl-nv1")
	must("ip", "-n", ns, "tuntap", "add", "dev", "sl-ntap", "mode", "tap")
	// lo and an IFB support neither link modes nor channels: those are
	// unknown, not errors.
	devs := []string{"sl-nv0", "sl-ntap", "lo"}
	if out, err := run("ip", "-n", ns, "link", "add", "sl-nifb", "type", "ifb"); err == nil {
		devs = append(devs, "sl-nifb")
	} else {
		t.Logf("no IFB (%s): checked on lo only", strings.TrimSpace(out))
	}
	for _, d := range append(devs, "sl-nv1") {
		must("ip", "-n", ns, "link", "set", d, "up")
	}

	r, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	recorded := map[string][]byte{}
	r.record = func(cmd uint8, dev string, reply []byte) {
		recorded[fmt.Sprintf("%s-%d", dev, cmd)] = append([]byte(nil), reply...)
	}
	ethtool := func(args ...string) (string, error) {
		return run(append([]string{"ip", "netns", "exec", ns, "ethtool"}, args...)...)
	}
	for _, dev := range devs {
		info, err := r.Read(dev)
		if err != nil {
			t.Errorf("Read %s: %v", dev, err)
			continue
		}
		t.Logf("%s: %s; unknown: %v", dev, info.Summary(), info.Unknown)
		compare(t, info, ethtool, must("ip", "-n", ns, "-d", "link", "show", dev))
	}
	for _, dev := range devs[2:] {
		info, _ := r.Read(dev)
		if info.Channels != nil || info.SpeedBps != 0 || !slices.Contains(info.Unknown, "channels (not supported by the device)") {
			t.Errorf("%s: channels %v, speed %d, unknown %q: want channels and speed unknown, not supported", dev, info.Channels, info.SpeedBps, info.Unknown)
		}
	}

	must("ip", "netns", "exec", ns, "ethtool", "-K", "sl-nv0", "gso", "off")
	info, err := r.Read("sl-nv0")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := info.Offload("gso"); !ok || o.On || o.Fixed {
		t.Errorf("after ethtool -K sl-nv0 gso off: gso %+v (known %v), want off and not fixed", o, ok)
	}
	compare(t, info, ethtool, must("ip", "-n", ns, "-d", "link", "show", "sl-nv0"))
	warned := false
	for _, w := range info.Warnings() {
		t.Logf("warning: %s", w)
		if strings.HasPrefix(w, "GSO is off on sl-nv0") && strings.Contains(w, "ethtool -K sl-nv0 gso on") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("GSO off on sl-nv0, warnings %q: none names it", info.Warnings())
	}
	recorded["sl-nv0-gso-off"] = recorded[fmt.Sprintf("sl-nv0-%d", msgFeaturesGet)]

	if *record {
		for file, key := range map[string]string{
			"veth-linkmodes": fmt.Sprintf("sl-nv0-%d", msgLinkModesGet),
			"veth-channels":  fmt.Sprintf("sl-nv0-%d", msgChannelsGet),
			"veth-gso-off":   "sl-nv0-gso-off",
			"tap-channels":   fmt.Sprintf("sl-ntap-%d", msgChannelsGet),
			"tap-features":   fmt.Sprintf("sl-ntap-%d", msgFeaturesGet),
		} {
			b, ok := recorded[key]
			if !ok {
				t.Errorf("no reply %s recorded", key)
				continue
			}
			kernel, _ := run("uname", "-r")
			text := fmt.Sprintf("# %s: a reply of ethtool netlink (generic netlink header and attributes), recorded by TestReadLive -record on kernel %s%s\n",
				file, strings.TrimSpace(kernel), hexLines(b))
			if err := os.WriteFile(filepath.Join("testdata", file+".hex"), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

var devs = flag.String("dev", "lo", "TestReadDev: the devices to read in this namespace, comma-separated")

// TestReadDev reads the devices -dev names (lo by default) in the
// namespace it runs in and compares every field with the ethtool CLI and
// ip -d link, as TestReadLive does. livetest/nicguest runs it inside a
// QEMU guest on the guest's virtio NIC.
func TestReadDev(t *testing.T) {
	for _, tool := range []string{"ip", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: scripts/deps.sh installs it", tool)
		}
	}
	r, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ethtool := func(args ...string) (string, error) {
		out, err := exec.Command("ethtool", args...).CombinedOutput()
		return string(out), err
	}
	for _, dev := range strings.Split(*devs, ",") {
		info, err := r.Read(dev)
		if err != nil {
			t.Errorf("Read %s: %v", dev, err)
			continue
		}
		t.Logf("%s: %s; unknown: %v", dev, info.Summary(), info.Unknown)
		ipLink, err := exec.Command("ip", "-d", "link", "show", "dev", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("ip -d link show dev %s: %v: %s", dev, err, ipLink)
		}
		compare(t, info, ethtool, string(ipLink))
	}
}

// hexLines is b in hex, 32 bytes a line.
func hexLines(b []byte) string {
	var s strings.Builder
	for len(b) > 0 {
		n := min(32, len(b))
		s.WriteString("\n" + hex.EncodeToString(b[:n]))
		b = b[n:]
	}
	return s.String() + "\n"
}

// compare checks info against the ethtool CLI (ethtool runs it in the
// device's namespace) and ip -d link's line of the device.
func compare(t *testing.T, info Info, ethtool func(args ...string) (string, error), ipLink string) {
	t.Helper()
	dev := info.Dev
	// ethtool -i: the driver.
	if out, err := ethtool("-i", dev); err != nil {
		if info.Driver != "" {
			t.Errorf("%s: ethtool -i fails (%s), Read gives driver %q", dev, strings.TrimSpace(out), info.Driver)
		}
	} else {
		f := fields(out)
		for _, c := range []struct{ key, got string }{
			{"driver", info.Driver}, {"version", info.DriverVersion}, {"firmware-version", info.FirmwareVersion}, {"bus-info", info.BusInfo},
		} {
			if f[c.key] != c.got {
				t.Errorf("%s: %s %q, ethtool -i says %q", dev, c.key, c.got, f[c.key])
			}
		}
	}
	// ethtool DEV: speed and duplex.
	out, _ := ethtool(dev)
	f := fields(out)
	wantSpeed := int64(0)
	if m := regexp.MustCompile(`^(\d+)Mb/s$`).FindStringSubmatch(f["Speed"]); m != nil {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		wantSpeed = v * 1e6
	}
	if info.SpeedBps != wantSpeed {
		t.Errorf("%s: speed %d bit/s, ethtool says %q", dev, info.SpeedBps, f["Speed"])
	}
	wantDuplex := map[string]string{"Full": "full", "Half": "half"}[f["Duplex"]]
	if info.Duplex != wantDuplex {
		t.Errorf("%s: duplex %q, ethtool says %q", dev, info.Duplex, f["Duplex"])
	}
	// ethtool -l: the channels, or "not supported".
	if out, err := ethtool("-l", dev); err != nil {
		if !strings.Contains(out, "not supported") {
			t.Errorf("%s: ethtool -l: %v: %s", dev, err, out)
		}
		if info.Channels != nil {
			t.Errorf("%s: ethtool -l says %q, Read gives channels %v", dev, strings.TrimSpace(out), info.Channels)
		}
	} else if info.Channels == nil {
		t.Errorf("%s: no channels, ethtool -l shows them:\n%s", dev, out)
	} else {
		max, cur, _ := strings.Cut(out, "Current hardware settings:")
		fm, fc := fields(max), fields(cur)
		c := info.Channels
		for _, k := range []struct {
			key      string
			cur, max uint32
		}{{"RX", c.RX, c.MaxRX}, {"TX", c.TX, c.MaxTX}, {"Other", c.Other, c.MaxOther}, {"Combined", c.Combined, c.MaxCombined}} {
			if got := channelText(k.max, k.max); got != fm[k.key] {
				t.Errorf("%s: max %s %s, ethtool -l says %q", dev, k.key, got, fm[k.key])
			}
			if got := channelText(k.cur, k.max); got != fc[k.key] {
				t.Errorf("%s: %s %s, ethtool -l says %q", dev, k.key, got, fc[k.key])
			}
		}
	}
	// ethtool -k: the legacy line of each offload, on or off; fixed as
	// its one feature is, or when it groups several (indented below it),
	// when all of them are.
	out, err := ethtool("-k", dev)
	if err != nil {
		t.Fatalf("ethtool -k %s: %v: %s", dev, err, out)
	}
	k := offloadLines(out)
	for _, name := range OffloadNames() {
		line := ethtoolLine(name)
		o, ok := info.Offload(name)
		got := "off"
		if o.On {
			got = "on"
		}
		if o.Fixed {
			got += " [fixed]"
		}
		if want := k[line]; !ok || got != want {
			t.Errorf("%s: %s %q (known %v), ethtool -k says %s: %q", dev, name, got, ok, line, want)
		}
	}
	// ip -d link: the queues.
	m := regexp.MustCompile(`numtxqueues (\d+) numrxqueues (\d+)`).FindStringSubmatch(ipLink)
	if m == nil || m[1] != strconv.Itoa(info.TxQueues) || m[2] != strconv.Itoa(info.RxQueues) {
		t.Errorf("%s: %d TX, %d RX queues; ip -d link: %v", dev, info.TxQueues, info.RxQueues, m)
	}
}

// offloadLines reads ethtool -k's legacy lines (not indented): "on" or
// "off", with " [fixed]" when the line says so or, for a line with
// features indented below it, when all of those say so.
func offloadLines(out string) map[string]string {
	m := map[string]string{}
	var last string
	allFixed := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.HasPrefix(l, "Features for") {
			continue
		}
		fixed := strings.Contains(v, "[fixed]")
		state, _, _ := strings.Cut(strings.TrimSpace(v), " ")
		if strings.HasPrefix(l, "\t") {
			if _, seen := allFixed[last]; !seen {
				allFixed[last] = true
			}
			allFixed[last] = allFixed[last] && fixed
			continue
		}
		last = k
		m[k] = state
		if fixed {
			m[k] += " [fixed]"
		}
	}
	for k, fixed := range allFixed {
		if fixed {
			m[k] += " [fixed]"
		}
	}
	return m
}

// channelText is a channel count as ethtool -l prints it: n/a where the
// maximum is 0.
func channelText(v, max uint32) string {
	if max == 0 {
		return "n/a"
	}
	return strconv.FormatUint(uint64(v), 10)
}

// fields are the "key: value" lines of ethtool's output, keys and values
// trimmed.
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}
