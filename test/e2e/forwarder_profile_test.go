package e2e

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// profileSeconds is how long the profiles cover: long enough for some thousand samples per
// proxy at pprof's 100 Hz on two cores.
const profileSeconds = 10

// profileUnderLoad profiles the proxies (path → the base URL of its /debug/pprof/) at once for
// profileSeconds while l's 64 clients per proxy call Version, alternating between the proxies
// in slices: both profiles cover the same moments of the machine. It saves each proxy's CPU
// profile and the allocations made in the window to dir/PATH-cpu.pprof and
// dir/PATH-allocs.pprof, and reports each proxy's calls in the window and CPU time per call,
// so that the profiles' shares can be read per call.
func profileUnderLoad(b *testing.B, dir string, l *load, pids map[string]int, pprofURLs map[string]string) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	paths := make([]string, 0, len(pprofURLs))
	for path, base := range pprofURLs {
		paths = append(paths, path)
		for profile, file := range map[string]string{"profile": "cpu", "allocs": "allocs"} {
			wg.Go(func() {
				err := fetchProfile(b, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", base, profile, profileSeconds),
					filepath.Join(dir, path+"-"+file+".pprof"))
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			})
		}
	}
	slices.Sort(paths)
	// As many rounds of one slice per proxy as fill the profiles' window.
	rounds := int(profileSeconds * time.Second / (loadSlice * time.Duration(len(paths))))
	results := l.run(b, paths, pids, loadSlice, rounds)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	for path, r := range results {
		b.ReportMetric(float64(r.calls), path+"-profiled-calls")
		b.ReportMetric(r.cpuPerCall(), path+"-profiled-cpu-µs/call")
	}
}

// fetchProfile saves the answer of GET url to path.
func fetchProfile(b *testing.B, url, path string) error {
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return os.WriteFile(path, data, 0o644)
}
