package livelab

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// FioJob is what the live tests read of one fio job's JSON report.
type FioJob struct {
	Error int    `json:"error"`
	Read  FioDir `json:"read"`
	Write FioDir `json:"write"`
}

// FioDir is one direction of a fio job's report.
type FioDir struct {
	IOs int64 `json:"total_ios"` // I/Os issued (completed, failed or in flight)
	KiB int64 `json:"io_kbytes"` // completed successfully
}

// ParseFioJob reads the one job of fio's --output-format=json report;
// what comes before the JSON (fio's nbd engine prints "connected to NBD
// server" first) is skipped.
func ParseFioJob(out []byte) (FioJob, error) {
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var rep struct{ Jobs []FioJob }
	if err := json.Unmarshal(out, &rep); err != nil {
		return FioJob{}, fmt.Errorf("fio's JSON report: %v", err)
	}
	if len(rep.Jobs) != 1 {
		return FioJob{}, fmt.Errorf("fio's JSON report has %d jobs, want 1", len(rep.Jobs))
	}
	return rep.Jobs[0], nil
}

// FioLogEntry is one line of a fio log (write_iops_log, write_lat_log):
// time in ms, the value, the direction (0 read, 1 write), the block size
// and, with log_offset, the offset.
type FioLogEntry struct {
	Msec, Value int64
	Dir         int
	Size        int64
	Offset      int64
}

// ReadFioLog reads a fio log file.
func ReadFioLog(path string) ([]FioLogEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fio log: %w", err)
	}
	es, err := ParseFioLog(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return es, nil
}

// ParseFioLog parses the text of a fio log.
func ParseFioLog(b []byte) ([]FioLogEntry, error) {
	var err error
	var out []FioLogEntry
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		var v [5]int64
		for i := range min(len(f), len(v)) {
			if v[i], err = strconv.ParseInt(strings.TrimSpace(f[i]), 10, 64); err != nil {
				return nil, fmt.Errorf("%q: %v", line, err)
			}
		}
		if len(f) < 4 {
			return nil, fmt.Errorf("%q: want time, value, direction, size", line)
		}
		out = append(out, FioLogEntry{Msec: v[0], Value: v[1], Dir: int(v[2]), Size: v[3], Offset: v[4]})
	}
	return out, nil
}

var (
	failedWriteRE = regexp.MustCompile(`io_u error on file .*: write offset=(\d+)`)
	badBlockRE    = regexp.MustCompile(`verify: .* at file \S+ offset (\d+)`)
)

// FailedWrites are the offsets of the writes that fio's stderr reports
// failed (the client was told: their blocks may hold anything).
func FailedWrites(stderr string) map[int64]bool {
	out := map[int64]bool{}
	for _, m := range failedWriteRE.FindAllStringSubmatch(stderr, -1) {
		off, _ := strconv.ParseInt(m[1], 10, 64)
		out[off] = true
	}
	return out
}

// BadBlocks are the offsets at which fio's verification (its stderr)
// found wrong data, in order.
func BadBlocks(stderr string) []int64 {
	var out []int64
	for _, m := range badBlockRE.FindAllStringSubmatch(stderr, -1) {
		off, _ := strconv.ParseInt(m[1], 10, 64)
		out = append(out, off)
	}
	slices.Sort(out)
	return out
}

// FioStatusInterval is how often a FioStream's fio reports its progress
// (--status-interval).
const FioStatusInterval = "100ms"

// FioStream reads the output of fio run with --output-format=json and
// --status-interval: one JSON report per interval, then the final one.
// Each report's counts are fio's own: the I/Os it completed so far.
type FioStream struct {
	mu      sync.Mutex
	last    FioJob
	reports int
	final   []byte // the last report's text
	changed chan struct{}
	done    chan struct{}
}

// NewFioStream reads r (fio's stdout) until it ends.
func NewFioStream(r io.Reader) *FioStream {
	s := &FioStream{changed: make(chan struct{}), done: make(chan struct{})}
	go s.read(r)
	return s
}

func (s *FioStream) read(r io.Reader) {
	defer close(s.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var cur []byte
	in := false
	for sc.Scan() {
		line := sc.Bytes()
		// fio prints each report from a "{" line to a "}" line.
		switch {
		case !in && string(line) == "{":
			in, cur = true, append(cur[:0], '{', '\n')
		case in && string(line) == "}":
			in = false
			cur = append(cur, '}', '\n')
			if j, err := ParseFioJob(cur); err == nil {
				s.mu.Lock()
				s.last, s.reports = j, s.reports+1
				s.final = append([]byte(nil), cur...)
				close(s.changed)
				s.changed = make(chan struct{})
				s.mu.Unlock()
			}
		case in:
			cur = append(append(cur, line...), '\n')
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// Progress is fio's last report and a channel closed at the next one.
func (s *FioStream) Progress() (FioJob, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.changed
}

// Wait waits until cond holds for one of fio's reports (true) or fio's
// output ended first (false), and returns that report.
func (s *FioStream) Wait(cond func(FioJob) bool) (FioJob, bool) {
	for {
		j, next := s.Progress()
		if cond(j) {
			return j, true
		}
		select {
		case <-next:
		case <-s.done:
			j, _ := s.Progress()
			return j, cond(j)
		}
	}
}

// Final is the last report, once fio's output ended: its final report.
func (s *FioStream) Final() []byte {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final
}
