package livelab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// FioJob is what the live tests read of one fio job's JSON report.
type FioJob struct {
	Error int `json:"error"`
	Read  struct {
		IOs int64 `json:"total_ios"`
	} `json:"read"`
	Write struct {
		IOs int64 `json:"total_ios"`
	} `json:"write"`
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
	var out []FioLogEntry
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		var v [5]int64
		for i := range min(len(f), len(v)) {
			if v[i], err = strconv.ParseInt(strings.TrimSpace(f[i]), 10, 64); err != nil {
				return nil, fmt.Errorf("%s: %q: %v", path, line, err)
			}
		}
		if len(f) < 4 {
			return nil, fmt.Errorf("%s: %q: want time, value, direction, size", path, line)
		}
		out = append(out, FioLogEntry{Msec: v[0], Value: v[1], Dir: int(v[2]), Size: v[3], Offset: v[4]})
	}
	return out, nil
}
