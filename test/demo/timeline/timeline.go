// Package timeline draws the start of pods on one time axis, as an SVG picture: the CRI calls
// the kubelet (or the demo, in its place) made, podgate's stages inside them, and instants seen
// by other programs (the CNI ADD the recording plugin saw, the DRA driver's prepare). Each pod
// gets a panel of its own, one row per call, stage or instant, so that a stage of 50 µs and a
// pull of seconds are both readable: the row's label says the duration, the bar says when.
//
// The picture carries its data: every bar is a <g class="span"> with data-lane, data-stage,
// data-start-ms and data-end-ms (milliseconds from the pod's first event), every instant a
// <g class="mark"> with data-mark and data-at-ms, so that Read gives back what was drawn.
package timeline

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Lanes: who did the work.
const (
	// Kubelet is the CRI client's side: a call from when it was made to when it was answered.
	Kubelet = "kubelet"
	// Podgate is podgate's side: a stage, timed by podgate itself.
	Podgate = "podgate"
)

// Span is one bar: a call or a stage.
type Span struct {
	// Lane is Kubelet or Podgate.
	Lane string
	// Name is the call (RunPodSandbox) or the stage (forward, pull-wait).
	Name string
	// Start and End are when it ran.
	Start, End time.Time
	// Detail is shown on hover.
	Detail string
}

// Mark is one instant another program saw.
type Mark struct {
	// Name says what happened (CNI ADD).
	Name string
	// At is when.
	At time.Time
	// Detail is shown on hover and beside the mark.
	Detail string
}

// Pod is the start of one pod.
type Pod struct {
	// Name is namespace/name.
	Name string
	// Spans are drawn one row each, in this order.
	Spans []Span
	// Marks are drawn one row each after the spans, with a line across the panel.
	Marks []Mark
}

// origin and end are the pod's first and last instants.
func (p Pod) bounds() (origin, end time.Time) {
	first := true
	add := func(t time.Time) {
		if first || t.Before(origin) {
			origin = t
		}
		if first || t.After(end) {
			end = t
		}
		first = false
	}
	for _, s := range p.Spans {
		add(s.Start)
		add(s.End)
	}
	for _, m := range p.Marks {
		add(m.At)
	}
	return origin, end
}

// Layout of the picture, in pixels.
const (
	width      = 1120
	labelWidth = 330
	chartLeft  = labelWidth + 10
	chartWidth = width - chartLeft - 30
	rowHeight  = 20
	barHeight  = 13
	panelHead  = 46
	panelGap   = 26
	titleSpace = 56
	minBar     = 1.5 // a stage of microseconds still shows
)

// Write draws the pods, one panel each, under title.
func Write(w io.Writer, title string, pods []Pod) error {
	height := titleSpace
	for _, p := range pods {
		height += panelHeight(p) + panelGap
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	b.WriteString(style)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#fff"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text class="title" x="12" y="24">%s</text>`+"\n", esc(title))
	fmt.Fprintf(b, `<text class="note" x="12" y="42">%s</text>`+"\n", esc("kubelet rows: CRI calls as the client saw them; podgate rows: podgate's own timings of its work; "+
		"other rows: instants logged by the CNI plugin and the DRA driver. Hover for details."))
	y := titleSpace
	for _, p := range pods {
		writePod(b, p, y)
		y += panelHeight(p) + panelGap
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func panelHeight(p Pod) int { return panelHead + rowHeight*(len(p.Spans)+len(p.Marks)) + 8 }

const style = `<style>
.title { font-size: 16px; font-weight: bold; }
.note { fill: #555; }
.pod-name { font-size: 14px; font-weight: bold; }
.axis { stroke: #bbb; stroke-width: 0.5; }
.tick { fill: #777; font-size: 10px; }
.lane-kubelet { fill: #555; }
.lane-podgate { fill: #0b5394; }
.bar-kubelet { fill: #cfcfcf; }
.bar-podgate { fill: #3d85c6; }
.bar-pull-wait { fill: #f6b26b; }
.bar-pull { fill: #6fa8dc; }
.bar-sysctl { fill: #93c47d; }
.bar-dra { fill: #8e7cc3; }
.bar-forward { fill: #76a5af; }
.mark-line { stroke: #cc0000; stroke-width: 1; stroke-dasharray: 3,3; }
.mark-dot { fill: #cc0000; }
</style>
`

// barClass colours a podgate stage by the feature it belongs to.
func barClass(s Span) string {
	if s.Lane != Podgate {
		return "bar-kubelet"
	}
	switch {
	case s.Name == "pull-wait":
		return "bar-pull-wait"
	case s.Name == "pull":
		return "bar-pull"
	case strings.HasPrefix(s.Name, "sysctl"):
		return "bar-sysctl"
	case strings.HasPrefix(s.Name, "dra"):
		return "bar-dra"
	case s.Name == "forward":
		return "bar-forward"
	}
	return "bar-podgate"
}

func writePod(b *strings.Builder, p Pod, top int) {
	origin, end := p.bounds()
	total := max(end.Sub(origin), time.Millisecond)
	step := tickStep(total)
	// The axis ends on a tick, so that the last bar ends inside the chart.
	span := time.Duration(math.Ceil(float64(total)/float64(step))) * step
	x := func(t time.Time) float64 {
		return chartLeft + float64(t.Sub(origin))/float64(span)*chartWidth
	}
	rows := len(p.Spans) + len(p.Marks)
	bottom := top + panelHead + rows*rowHeight
	fmt.Fprintf(b, `<g class="pod" data-pod="%s">`+"\n", esc(p.Name))
	fmt.Fprintf(b, `<text class="pod-name" x="12" y="%d">%s</text>`+"\n", top+16, esc(p.Name))
	fmt.Fprintf(b, `<text class="note" x="12" y="%d">%s</text>`+"\n", top+32, esc("started "+origin.Format("15:04:05.000")+", "+FormatDuration(total)+" in all"))
	for t := time.Duration(0); t <= span; t += step {
		tx := chartLeft + float64(t)/float64(span)*chartWidth
		fmt.Fprintf(b, `<line class="axis" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", tx, top+panelHead-6, tx, bottom)
		fmt.Fprintf(b, `<text class="tick" x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", tx, top+panelHead-9, esc(fmtTick(t)))
	}
	y := top + panelHead
	for _, s := range p.Spans {
		x0, x1 := x(s.Start), x(s.End)
		label := s.Name
		if s.Lane == Podgate {
			label = "  " + label // podgate's stages sit under the call they serve
		}
		detail := s.Lane + ": " + s.Name + ", " + FormatDuration(s.End.Sub(s.Start))
		if s.Detail != "" {
			detail += " — " + s.Detail
		}
		fmt.Fprintf(b, `<g class="span" data-lane="%s" data-stage="%s" data-start-ms="%.3f" data-end-ms="%.3f"><title>%s</title>`,
			esc(s.Lane), esc(s.Name), ms(s.Start.Sub(origin)), ms(s.End.Sub(origin)), esc(detail))
		fmt.Fprintf(b, `<text class="lane-%s" x="12" y="%d">%s</text>`, esc(s.Lane), y+barHeight-2, esc(s.Lane))
		fmt.Fprintf(b, `<text x="80" y="%d" xml:space="preserve">%s</text>`, y+barHeight-2, esc(label))
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelWidth, y+barHeight-2, esc(FormatDuration(s.End.Sub(s.Start))))
		fmt.Fprintf(b, `<rect class="%s" x="%.1f" y="%d" width="%.1f" height="%d"/></g>`+"\n", barClass(s), x0, y+2, max(x1-x0, minBar), barHeight)
		y += rowHeight
	}
	for _, m := range p.Marks {
		mx := x(m.At)
		fmt.Fprintf(b, `<g class="mark" data-mark="%s" data-at-ms="%.3f"><title>%s</title>`,
			esc(m.Name), ms(m.At.Sub(origin)), esc(m.Name+" at +"+FormatDuration(m.At.Sub(origin))+": "+m.Detail))
		fmt.Fprintf(b, `<line class="mark-line" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, mx, top+panelHead, mx, y+rowHeight)
		fmt.Fprintf(b, `<text class="mark-dot" x="12" y="%d">%s</text>`, y+barHeight-2, esc(m.Name))
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelWidth, y+barHeight-2, esc("+"+FormatDuration(m.At.Sub(origin))))
		fmt.Fprintf(b, `<circle class="mark-dot" cx="%.1f" cy="%d" r="4"/>`, mx, y+2+barHeight/2)
		anchor, tx := "start", mx+7
		if mx > chartLeft+chartWidth*0.6 {
			anchor, tx = "end", mx-7
		}
		fmt.Fprintf(b, `<text class="note" x="%.1f" y="%d" text-anchor="%s">%s</text></g>`+"\n", tx, y+barHeight-2, anchor, esc(m.Detail))
		y += rowHeight
	}
	b.WriteString("</g>\n")
}

// tickStep picks 1, 2 or 5 × 10^k so that the axis has 5 to 10 ticks.
func tickStep(total time.Duration) time.Duration {
	step := time.Microsecond
	for {
		for _, f := range []time.Duration{1, 2, 5} {
			if total/(f*step) <= 10 {
				return f * step
			}
		}
		step *= 10
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// FormatDuration writes d with three significant digits at most: 48µs, 1.25ms, 312ms, 2.31s.
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", ms(d))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", ms(d))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func fmtTick(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d < time.Second {
		return fmt.Sprintf("%gms", ms(d))
	}
	return fmt.Sprintf("%gs", d.Seconds())
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
