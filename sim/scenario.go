package sim

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"sluice/alloc"
	"sluice/internal/inputfile"
	"sluice/policy"
)

// Scenario is a scenario file (docs/sim.md): a policy, workloads, a
// timeline, runs to compare, what to plot and what to expect.
type Scenario struct {
	Name        string         `yaml:"name"`
	Description string         `yaml:"description"`
	Seed        uint64         `yaml:"seed"`
	Duration    string         `yaml:"duration"`
	Sample      string         `yaml:"sample"`
	Scheduler   string         `yaml:"scheduler"` // netioc (default) | default
	Policy      yaml.Node      `yaml:"policy"`    // inline policy, or a file name relative to the scenario
	Models      ModelSpec      `yaml:"models"`
	Workloads   []WorkloadSpec `yaml:"workloads"`
	Timeline    []EventSpec    `yaml:"timeline"`
	Runs        []RunSpec      `yaml:"runs"`
	Expect      []ExpectSpec   `yaml:"expect"`
	Plots       []PlotSpec     `yaml:"plots"`
	// Record lists the series (names or prefixes ending in ':') written to
	// the CSV files; empty: all. Expectations and plots see every series.
	Record []string          `yaml:"record"`
	Seed2  map[string]string `yaml:"seedValues"` // free text shown in the report: seed figure per expectation name
	// Calibration says which model parameters of this setup were fitted,
	// to what, once for all its runs (shown on every simulated row of the
	// report); empty: the defaults of docs/sim.md.
	Calibration string `yaml:"calibration"`
	// Live holds the live measurements of the kind: live expectations
	// (LoadLiveFigures); nil: none, they stay pending.
	Live *LiveFigures `yaml:"-"`

	file            string
	pol             *policy.Policy
	durNs, sampleNs int64
}

// ModelSpec overrides model parameters; every field is optional.
type ModelSpec struct {
	Net struct {
		Segment   string `yaml:"segment"`
		BaseRTT   string `yaml:"baseRTT"`
		PortQueue int    `yaml:"portQueue"`
		VMotion   string `yaml:"vmotionRate"`
	} `yaml:"net"`
	// CPU, when it gives any field, replaces the CPU model as a whole
	// (a calibration of another machine): the fields it leaves out are 0
	// (peakMHz 0: the host's clock).
	CPU struct {
		CyclesPerByte   float64 `yaml:"cyclesPerByte"`
		CyclesPerPacket float64 `yaml:"cyclesPerPacket"`
		CyclesPerAck    float64 `yaml:"cyclesPerAck"`
		AckBytes        float64 `yaml:"ackBytes"`
		MaxAckRate      float64 `yaml:"maxAckRate"`
		OverheadMHz     float64 `yaml:"overheadMHz"`
		PeakMHz         float64 `yaml:"peakMHz"`
	} `yaml:"cpu"`
	Storage StorageSpec `yaml:"storage"`
}

// WorkloadSpec is one workload.
type WorkloadSpec struct {
	Name       string `yaml:"name"`
	Type       string `yaml:"type"` // bulk | transfer | rr | oltp | iometer
	Port       string `yaml:"port"`
	Disk       string `yaml:"disk"`
	Streams    int    `yaml:"streams"`
	Window     string `yaml:"window"`
	Rate       string `yaml:"rate"`
	Bytes      string `yaml:"bytes"`
	Response   string `yaml:"response"`
	ServerTime string `yaml:"serverTime"`
	// Requests is the number of request/response exchanges of one rr
	// operation, one after the other (default 1; an Olio page is 20 HTTP
	// requests on average); Response and ServerTime are the operation's
	// totals, split evenly over them.
	Requests    int    `yaml:"requests"`
	Users       int    `yaml:"users"`
	Think       string `yaml:"think"`
	IOsPerOrder int    `yaml:"iosPerOrder"`
	IOSize      string `yaml:"ioSize"`
	Outstanding int    `yaml:"outstanding"`
	Start       string `yaml:"start"` // default 0s; "never": only by an event
	Stop        string `yaml:"stop"`
	// Direction of a bulk or transfer workload: "out" (default: the VM
	// sends through its port) or "in" (the fabric sends to the VM: it
	// crosses the model of what the uplink receives, port in:VM/NIC).
	Direction string `yaml:"direction"`
	Line      int    `yaml:"-"`
}

// EventSpec is one timeline event; exactly one action is set.
type EventSpec struct {
	At          string `yaml:"at"`
	Start       string `yaml:"start"`
	Stop        string `yaml:"stop"`
	Set         string `yaml:"set"` // VM/NIC, HOST/CLASS, VM/DISK, or VM (cpu)
	Reservation string `yaml:"reservation"`
	Shares      string `yaml:"shares"`
	Limit       string `yaml:"limit"`
	CPULimit    string `yaml:"cpuLimit"` // MHz or % of the host core
	Migrate     string `yaml:"migrate"`
	To          string `yaml:"to"`
	DRS         bool   `yaml:"drs"`
	Fail        string `yaml:"fail"`    // HOST/UPLINK
	PowerOn     string `yaml:"powerOn"` // VM
	SIOC        string `yaml:"sioc"`    // datastore
	Enabled     *bool  `yaml:"enabled"`
	Threshold   string `yaml:"threshold"`
	Line        int    `yaml:"-"`
}

// RunSpec is one run of the scenario; runs differ by scheduler, events and
// the workloads they leave out.
type RunSpec struct {
	Name      string `yaml:"name"`
	Scheduler string `yaml:"scheduler"`
	// Driver runs every datastore with this storage driver (gateway,
	// throttle) instead of the policy's.
	Driver  string      `yaml:"driver"`
	Events  []EventSpec `yaml:"events"`
	Without []string    `yaml:"without"`
	Line    int         `yaml:"-"`
}

// ExpectSpec is one expectation: a metric measured over a window of a
// run, optionally divided by the same or another metric of a reference run,
// compared with a value within a tolerance.
type ExpectSpec struct {
	Name       string   `yaml:"name"`
	Run        string   `yaml:"run"`
	Metric     string   `yaml:"metric"`
	Of         string   `yaml:"of"`
	From       string   `yaml:"from"`
	To         string   `yaml:"to"`
	Value      string   `yaml:"value"`
	Op         string   `yaml:"op"` // "=" (default, within tol), ">=", "<=", "between"
	Tol        string   `yaml:"tol"`
	Max        string   `yaml:"max"` // for between
	RelativeTo *RefSpec `yaml:"relativeTo"`
	Seed       string   `yaml:"seed"` // the seed's figure, for the report
	// Better marks the outcome of a control (isolation, protection):
	// "higher" or "lower" is the better direction; the report says
	// whether the measure beats SeedValue (default: Value), the seed's
	// figure in the value's unit.
	Better    string `yaml:"better"`
	SeedValue string `yaml:"seedValue"`
	// Kind "baseline" marks a figure of the uncontrolled baseline or of
	// the hardware: two-sided, and a miss is a model calibration
	// difference. Kind "live" marks a figure that only a live measurement
	// can give (a cost of the implementation that the simulator does not
	// model): the simulator does not judge it; Value, Op, Tol and Max are
	// judged against the live figure of the same name (Scenario.Live),
	// in Unit ("ratio" by default), and the row is pending without one.
	Kind string `yaml:"kind"`
	// Live names the live measurement of a kind: live expectation (the
	// command that makes it).
	Live string `yaml:"live"`
	Unit string `yaml:"unit"`
	Line int    `yaml:"-"`
}

// RefSpec names the reference of a relative expectation; empty fields
// default to the expectation's own.
type RefSpec struct {
	Run    string `yaml:"run"`
	Metric string `yaml:"metric"`
	Of     string `yaml:"of"`
	From   string `yaml:"from"`
	To     string `yaml:"to"`
	// Diff makes the measure the difference (this − reference) instead of
	// the ratio.
	Diff bool `yaml:"diff"`
}

// PlotSpec draws series of runs into one figure.
type PlotSpec struct {
	Name   string   `yaml:"name"`
	Title  string   `yaml:"title"`
	Run    string   `yaml:"run"`
	Series []string `yaml:"series"` // series names or prefixes (rate_bps:vm1/nic0, rate_bps:)
	YLabel string   `yaml:"ylabel"`
	Scale  float64  `yaml:"scale"` // values are multiplied by it (1e-9 for Gbps)
	// Kind "expectations" draws every expectation's expected and measured
	// value as bars instead of time series.
	Kind string `yaml:"kind"`
}

// UnmarshalYAML decodes a WorkloadSpec and keeps its line for messages.
func (w *WorkloadSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain WorkloadSpec
	w.Line = n.Line
	return n.Decode((*plain)(w))
}

// UnmarshalYAML decodes a EventSpec and keeps its line for messages.
func (e *EventSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain EventSpec
	e.Line = n.Line
	return n.Decode((*plain)(e))
}

// UnmarshalYAML decodes a RunSpec and keeps its line for messages.
func (r *RunSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain RunSpec
	r.Line = n.Line
	return n.Decode((*plain)(r))
}

// UnmarshalYAML decodes a ExpectSpec and keeps its line for messages.
func (x *ExpectSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain ExpectSpec
	x.Line = n.Line
	return n.Decode((*plain)(x))
}

// lineErr is a one-line FILE:LINE: field: message error.
func lineErr(file string, line int, field, format string, a ...any) error {
	return fmt.Errorf("%s:%d: %s: %s", file, line, field, fmt.Sprintf(format, a...))
}

// Limits of a scenario, far beyond the seeds' (20 minutes, 100 VMs), so
// that no file can make a run take hours or exhaust memory.
const (
	MaxScenarioDurationNs = 2 * 3600 * Second // simulated time
	MaxScenarioSamples    = 100_000           // duration / sample
)

// maxScenarioItems caps the lists of a scenario file.
var maxScenarioItems = map[string]int{
	"workloads": 10_000, "timeline": 10_000, "runs": 100, "expect": 1_000, "plots": 1_000, "record": 1_000,
}

// LoadScenario reads and checks a scenario file (at most
// policy.MaxFileBytes, a regular file).
func LoadScenario(path string) (*Scenario, error) {
	data, err := inputfile.Read(path, policy.MaxFileBytes)
	if err != nil {
		return nil, err
	}
	return ParseScenario(path, data)
}

// ParseScenario parses scenario text; file names it in messages and is the
// base of a relative policy file name.
func ParseScenario(file string, data []byte) (*Scenario, error) {
	if err := policy.ScanLimits(file, data); err != nil {
		return nil, err
	}
	if err := checkScenarioLists(file, data); err != nil {
		return nil, err
	}
	sc := &Scenario{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(sc); err != nil {
		msg := err.Error()
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			msg = te.Errors[0] // "line N: ..."; the first problem, counting the rest
			if n := len(te.Errors) - 1; n > 0 {
				msg += fmt.Sprintf(" (and %d more)", n)
			}
		}
		msg = strings.TrimSpace(strings.TrimPrefix(msg, "yaml: "))
		line := 1
		if i := strings.Index(msg, "line "); i >= 0 {
			fmt.Sscanf(msg[i+5:], "%d", &line)
		}
		if rest, ok := strings.CutPrefix(msg, fmt.Sprintf("line %d: ", line)); ok {
			msg = rest
		}
		msg = strings.Join(strings.Fields(msg), " ") // one line
		return nil, lineErr(file, line, "scenario", "%s", msg)
	}
	var err error
	if sc.durNs, err = durNs(sc.Duration, 60*Second); err != nil {
		return nil, lineErr(file, 1, "duration", "%v", err)
	}
	if sc.sampleNs, err = durNs(sc.Sample, Second); err != nil || sc.sampleNs <= 0 {
		return nil, lineErr(file, 1, "sample", "must be a positive time")
	}
	if sc.durNs <= 0 || sc.durNs > MaxScenarioDurationNs {
		return nil, lineErr(file, keyLine(data, "duration"), "duration", "%s: must be positive and at most %s", clipText(sc.Duration), time.Duration(MaxScenarioDurationNs))
	}
	if sc.durNs/sc.sampleNs > MaxScenarioSamples {
		return nil, lineErr(file, keyLine(data, "sample"), "sample", "%s: more than %d samples in %s", clipText(sc.Sample), MaxScenarioSamples, time.Duration(sc.durNs))
	}
	switch sc.Policy.Kind {
	case yaml.ScalarNode:
		p := sc.Policy.Value
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(file), p)
		}
		sc.pol, err = policy.Load(p)
	case yaml.MappingNode:
		sc.pol, err = parseInlinePolicy(file, data, &sc.Policy)
	default:
		return nil, lineErr(file, 1, "policy", "missing: give a policy inline or a file name")
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), file) {
			return nil, err // FILE:LINE: field: message, one line per problem
		}
		return nil, fmt.Errorf("%s: policy: %s", file, err)
	}
	for _, vm := range sc.pol.VMs {
		if vm.Host == "" {
			return nil, fmt.Errorf("%s: vm %s: no host given (the simulator needs every VM placed)", file, vm.Name)
		}
	}
	if len(sc.Runs) == 0 {
		sc.Runs = []RunSpec{{Name: "main"}}
	}
	for _, w := range sc.Workloads {
		switch w.Type {
		case "bulk", "transfer", "rr", "oltp", "iometer":
		default:
			return nil, lineErr(file, w.Line, "type", "unknown workload type %q (bulk, transfer, rr, oltp, iometer)", w.Type)
		}
	}
	if err := checkPardaLaw(sc.Models.Storage.Parda); err != nil {
		return nil, lineErr(file, keyLine(data, "models", "storage", "parda"), "models.storage.parda", "%v", err)
	}
	for _, x := range sc.Expect {
		switch {
		case x.Better != "" && x.Better != "higher" && x.Better != "lower":
			return nil, lineErr(file, x.Line, "better", "unknown %q (higher, lower)", x.Better)
		case x.Kind != "" && x.Kind != "control" && x.Kind != "baseline" && x.Kind != "live":
			return nil, lineErr(file, x.Line, "kind", "unknown %q (control, baseline, live)", x.Kind)
		case x.Kind == "live" && x.Live == "":
			return nil, lineErr(file, x.Line, "live", "a kind: live expectation names its live measurement")
		case x.Kind != "live" && (x.Live != "" || x.Unit != ""):
			return nil, lineErr(file, x.Line, "live", "live and unit are for kind: live")
		case x.Better != "" && x.Kind == "baseline":
			return nil, lineErr(file, x.Line, "better", "a baseline figure is two-sided; better is for control outcomes")
		case x.SeedValue != "" && x.Better == "":
			return nil, lineErr(file, x.Line, "seedValue", "only with better (higher, lower)")
		}
	}
	return sc, nil
}

// checkScenarioLists refuses a list longer than maxScenarioItems allows,
// before the scenario is decoded.
func checkScenarioLists(file string, data []byte) error {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil // the decoder says what is wrong
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if max, ok := maxScenarioItems[k.Value]; ok && v.Kind == yaml.SequenceNode && len(v.Content) > max {
			return lineErr(file, v.Line, k.Value, "%d items, more than the %d a scenario may have", len(v.Content), max)
		}
	}
	return nil
}

// clipText shortens s for a one-line message.
func clipText(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// keyLine is the line of the value at the path of mapping keys in the YAML
// document data (e.g. "models", "storage", "parda"), or 1.
func keyLine(data []byte, path ...string) int {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return 1
	}
	n := doc.Content[0]
	for _, key := range path {
		var next *yaml.Node
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return 1
		}
		n = next
	}
	return n.Line
}

// durNs parses a time like 150s or 4ms; empty gives def.
func durNs(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad time %q", s)
	}
	return int64(d), nil
}

// parseRate parses a rate with units (policy syntax) to bits/s; "" gives def.
func parseRate(s string, def float64) (float64, error) {
	if s == "" {
		return def, nil
	}
	if s == "unlimited" {
		return alloc.Inf, nil
	}
	r, err := policy.ParseRate(s)
	if err != nil {
		return 0, err
	}
	return float64(r), nil
}

// parseSize parses a size (KiB, MiB, GiB, or a plain byte count).
func parseSize(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	if n, err := strconv.ParseInt(strings.TrimSuffix(s, "B"), 10, 64); err == nil {
		return n, nil
	}
	b, err := policy.ParseSize(s)
	return int64(b), err
}

// parseInlinePolicy parses the policy written inside a scenario. A block
// policy is cut out of the scenario text as written, so that policy errors
// name the scenario's own lines; a flow-style one is re-encoded.
func parseInlinePolicy(file string, data []byte, n *yaml.Node) (*policy.Policy, error) {
	lines := strings.Split(string(data), "\n")
	first := n.Line - 1 // index of the policy's first key line
	if n.Style&yaml.FlowStyle != 0 || first < 0 || first >= len(lines) {
		b, err := yaml.Marshal(n)
		if err != nil {
			return nil, err
		}
		return policy.Parse(file+"(policy)", b)
	}
	indent := len(lines[first]) - len(strings.TrimLeft(lines[first], " "))
	var body []string
	for i := first; i < len(lines); i++ {
		l := lines[i]
		t := strings.TrimLeft(l, " ")
		if t != "" && !strings.HasPrefix(t, "#") && len(l)-len(t) < indent {
			break
		}
		if len(l) >= indent {
			l = l[indent:]
		} else {
			l = t
		}
		body = append(body, l)
	}
	// Pad with blank lines so that line numbers are the scenario's.
	text := strings.Repeat("\n", first) + strings.Join(body, "\n") + "\n"
	return policy.Parse(file, []byte(text))
}
