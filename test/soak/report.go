package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// flatTolerance is how far a figure may move from its warm-up level: ±5 %.
const flatTolerance = 0.05

// report prints the figures and says whether they stayed flat and nothing was left over.
func report(samples []sample, left []string, took time.Duration) error {
	if len(samples) < 5 {
		return errors.New("too few samples to judge: run more lifecycles")
	}
	// Warm-up: the first fifth of the run (caches, pools and the Go heap find their size).
	warm := samples[len(samples)/5:]
	ref, last := warm[0], samples[len(samples)-1]
	var errs []error
	fmt.Printf("\n%d pod lifecycles in %s\n", last.lifecycles, took.Round(time.Second))
	for _, f := range []struct {
		name        string
		get         func(sample) float64
		start, peak float64
	}{
		{name: "RSS (MiB)", get: func(s sample) float64 { return s.rssMiB }},
		{name: "goroutines", get: func(s sample) float64 { return s.goroutines }},
		{name: "open fds", get: func(s sample) float64 { return s.openFDs }},
	} {
		lo, hi := f.get(ref), f.get(ref)
		for _, s := range warm {
			lo, hi = min(lo, f.get(s)), max(hi, f.get(s))
		}
		fmt.Printf("  %-11s start %.1f  after warm-up %.1f  end %.1f  after warm-up min %.1f max %.1f\n",
			f.name, f.get(samples[0]), f.get(ref), f.get(last), lo, hi)
		if d := (f.get(last) - f.get(ref)) / f.get(ref); d > flatTolerance || d < -flatTolerance {
			errs = append(errs, fmt.Errorf("%s moved %+.1f %% after warm-up (%.1f → %.1f)", f.name, d*100, f.get(ref), f.get(last)))
		}
	}
	if len(left) == 0 {
		fmt.Println("  leftovers: none (containerd objects, netns, bridge interfaces, registry, checkpoint)")
	}
	for _, l := range left {
		errs = append(errs, errors.New("left over: "+l))
	}
	return errors.Join(errs...)
}

// write saves the samples as CSV and a plot of RSS and goroutines as SVG.
func write(dir string, samples []sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var csv strings.Builder
	csv.WriteString("lifecycles,rss_mib,goroutines,open_fds\n")
	for _, s := range samples {
		fmt.Fprintf(&csv, "%d,%.2f,%.0f,%.0f\n", s.lifecycles, s.rssMiB, s.goroutines, s.openFDs)
	}
	if err := os.WriteFile(filepath.Join(dir, "samples.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(plot(samples)), 0o644)
}

// plot draws RSS (MiB) and goroutines against lifecycles, each on its own scale from zero.
func plot(samples []sample) string {
	const w, h, pad = 640, 300, 50
	maxX := float64(samples[len(samples)-1].lifecycles)
	var maxRSS, maxG float64
	for _, s := range samples {
		maxRSS, maxG = max(maxRSS, s.rssMiB), max(maxG, s.goroutines)
	}
	line := func(get func(sample) float64, top float64) string {
		var pts []string
		for _, s := range samples {
			x := pad + (w-2*pad)*float64(s.lifecycles)/maxX
			y := h - pad - (h-2*pad)*get(s)/(top*1.2)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		return strings.Join(pts, " ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", pad, h-pad, w-pad, h-pad)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", pad, pad, pad, h-pad)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">pod lifecycles (0 to %.0f)</text>`+"\n", w/2, h-15, maxX)
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", line(func(s sample) float64 { return s.rssMiB }, maxRSS))
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#d62728" stroke-width="2" points="%s"/>`+"\n", line(func(s sample) float64 { return s.goroutines }, maxG))
	fmt.Fprintf(&b, `<text x="%d" y="20" fill="#1f77b4">RSS, MiB (max %.1f; scale 0 to %.1f)</text>`+"\n", pad, maxRSS, maxRSS*1.2)
	fmt.Fprintf(&b, `<text x="%d" y="36" fill="#d62728">goroutines (max %.0f; scale 0 to %.0f)</text>`+"\n", pad, maxG, maxG*1.2)
	b.WriteString("</svg>\n")
	return b.String()
}
