//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// flatTolerance is how far a figure may move from its warm-up level: ±5 %.
const flatTolerance = 0.05

// report prints the figures and says whether they stayed flat and nothing was left over.
//
// A figure is judged by the median of the samples of the fifth of the run right after warm-up
// against the median of the last fifth's: a sample taken while calls are under way (in kubelet
// mode, several pods in flight) counts their goroutines and connections, which a single sample
// at either end would take for growth or shrinkage.
func report(mode string, res result) error {
	samples := res.samples
	if len(samples) < 5 {
		return errors.New("too few samples to judge: run more lifecycles")
	}
	// Warm-up: the first fifth of the run (caches, pools and the Go heap find their size).
	warm := samples[len(samples)/5:]
	window := max(1, len(samples)/5)
	last := samples[len(samples)-1]
	var errs []error
	fmt.Printf("\nmode %s: %d pod lifecycles in %s\n", mode, last.lifecycles, res.took.Round(time.Second))
	for _, f := range []struct {
		name string
		get  func(sample) float64
	}{
		{name: "RSS (MiB)", get: func(s sample) float64 { return s.rssMiB }},
		{name: "goroutines", get: func(s sample) float64 { return s.goroutines }},
		{name: "open fds", get: func(s sample) float64 { return s.openFDs }},
	} {
		lo, hi := f.get(warm[0]), f.get(warm[0])
		for _, s := range warm {
			lo, hi = min(lo, f.get(s)), max(hi, f.get(s))
		}
		ref, end := median(warm[:window], f.get), median(samples[len(samples)-window:], f.get)
		fmt.Printf("  %-11s start %.1f  after warm-up %.1f  end %.1f (last sample %.1f)  after warm-up min %.1f max %.1f\n",
			f.name, f.get(samples[0]), ref, end, f.get(last), lo, hi)
		if d := (end - ref) / ref; d > flatTolerance || d < -flatTolerance {
			errs = append(errs, fmt.Errorf("%s moved %+.1f %% after warm-up (%.1f → %.1f)", f.name, d*100, ref, end))
		}
	}
	fmt.Printf("  (after warm-up and end: medians of %d samples; every sample in samples.csv)\n", window)
	for _, n := range res.notes {
		fmt.Println("  " + n)
	}
	if len(res.left) == 0 {
		fmt.Println("  leftovers: none (containerd objects, netns, bridge interfaces, registry, checkpoint" +
			map[string]string{"kubelet": "; the kubelet's pod directories, logs and cgroups", "cri": ""}[mode] + ")")
	}
	for _, l := range res.left {
		errs = append(errs, errors.New("left over: "+l))
	}
	return errors.Join(errs...)
}

// median is the median of get over the samples.
func median(samples []sample, get func(sample) float64) float64 {
	v := make([]float64, 0, len(samples))
	for _, s := range samples {
		v = append(v, get(s))
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// write saves the samples as CSV and a plot of RSS and goroutines as SVG.
func write(dir, mode string, samples []sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var csv strings.Builder
	csv.WriteString("lifecycles,seconds,rss_mib,goroutines,open_fds\n")
	for _, s := range samples {
		fmt.Fprintf(&csv, "%d,%.1f,%.2f,%.0f,%.0f\n", s.lifecycles, s.elapsed.Seconds(), s.rssMiB, s.goroutines, s.openFDs)
	}
	if err := os.WriteFile(filepath.Join(dir, "samples.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(plot(mode, samples)), 0o644)
}

// plot draws RSS (MiB) and goroutines against time, each on its own scale from zero, with the
// end of warm-up marked.
func plot(mode string, samples []sample) string {
	const w, h, pad = 640, 300, 50
	last := samples[len(samples)-1]
	maxX := max(last.elapsed.Seconds(), 1)
	var maxRSS, maxG float64
	for _, s := range samples {
		maxRSS, maxG = max(maxRSS, s.rssMiB), max(maxG, s.goroutines)
	}
	xOf := func(s sample) float64 { return pad + (w-2*pad)*s.elapsed.Seconds()/maxX }
	line := func(get func(sample) float64, top float64) string {
		var pts []string
		for _, s := range samples {
			y := h - pad - (h-2*pad)*get(s)/(top*1.2)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(s), y))
		}
		return strings.Join(pts, " ")
	}
	warm := xOf(samples[len(samples)/5])
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", pad, h-pad, w-pad, h-pad)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", pad, pad, pad, h-pad)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="gray" stroke-dasharray="4 3"/>`+"\n", warm, pad, warm, h-pad)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="gray">end of warm-up</text>`+"\n", warm+4, h-pad-6)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time, s (0 to %.0f): %d pod lifecycles, %s mode</text>`+"\n", w/2, h-15, maxX, last.lifecycles, mode)
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", line(func(s sample) float64 { return s.rssMiB }, maxRSS))
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#d62728" stroke-width="2" points="%s"/>`+"\n", line(func(s sample) float64 { return s.goroutines }, maxG))
	fmt.Fprintf(&b, `<text x="%d" y="20" fill="#1f77b4">podgate RSS, MiB (max %.1f; scale 0 to %.1f)</text>`+"\n", pad, maxRSS, maxRSS*1.2)
	fmt.Fprintf(&b, `<text x="%d" y="36" fill="#d62728">podgate goroutines (max %.0f; scale 0 to %.0f)</text>`+"\n", pad, maxG, maxG*1.2)
	b.WriteString("</svg>\n")
	return b.String()
}
