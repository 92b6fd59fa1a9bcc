// Package procstat reads what the benchmarks report of a process from /proc: its resident
// memory, split as the kernel counts it, and it drops a binary from the page cache so that a
// process started from it maps its pages as after a node's reboot.
package procstat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory returns VmRSS, RssAnon, RssFile and RssShmem of process pid from /proc/PID/status,
// in MiB, keyed by those names.
func Memory(pid int) (map[string]float64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/status"
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem := map[string]float64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok || !strings.HasPrefix(k, "VmRSS") && !strings.HasPrefix(k, "Rss") {
			continue
		}
		kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, k, err)
		}
		mem[k] = kib / 1024
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, ok := mem["VmRSS"]; !ok {
		return nil, fmt.Errorf("%s: no VmRSS", path)
	}
	return mem, nil
}
