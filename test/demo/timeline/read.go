package timeline

import (
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
)

// DrawnSpan is a bar as Read finds it: times in milliseconds from the pod's first event.
type DrawnSpan struct {
	Lane, Name     string
	StartMS, EndMS float64
}

// DrawnMark is an instant as Read finds it.
type DrawnMark struct {
	Name string
	AtMS float64
}

// DrawnPod is a pod's panel as Read finds it, rows in the order drawn.
type DrawnPod struct {
	Name  string
	Spans []DrawnSpan
	Marks []DrawnMark
}

// element is any XML element, with its attributes and children.
type element struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Children []element  `xml:",any"`
}

func (e element) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (e element) float(name string) (float64, error) {
	f, err := strconv.ParseFloat(e.attr(name), 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", name, e.attr(name), err)
	}
	return f, nil
}

// Read parses a picture Write made (with encoding/xml) and returns its pods.
func Read(r io.Reader) ([]DrawnPod, error) {
	var root element
	if err := xml.NewDecoder(r).Decode(&root); err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	if root.XMLName.Local != "svg" {
		return nil, fmt.Errorf("timeline: root element %s, want svg", root.XMLName.Local)
	}
	var pods []DrawnPod
	for _, g := range root.Children {
		if g.XMLName.Local != "g" || g.attr("class") != "pod" {
			continue
		}
		pod := DrawnPod{Name: g.attr("data-pod")}
		for _, c := range g.Children {
			switch c.attr("class") {
			case "span":
				start, err := c.float("data-start-ms")
				if err != nil {
					return nil, fmt.Errorf("timeline: pod %s: %w", pod.Name, err)
				}
				end, err := c.float("data-end-ms")
				if err != nil {
					return nil, fmt.Errorf("timeline: pod %s: %w", pod.Name, err)
				}
				pod.Spans = append(pod.Spans, DrawnSpan{Lane: c.attr("data-lane"), Name: c.attr("data-stage"), StartMS: start, EndMS: end})
			case "mark":
				at, err := c.float("data-at-ms")
				if err != nil {
					return nil, fmt.Errorf("timeline: pod %s: %w", pod.Name, err)
				}
				pod.Marks = append(pod.Marks, DrawnMark{Name: c.attr("data-mark"), AtMS: at})
			}
		}
		pods = append(pods, pod)
	}
	return pods, nil
}

// Span returns the pod's first span of that lane and name.
func (p DrawnPod) Span(lane, name string) (DrawnSpan, bool) {
	for _, s := range p.Spans {
		if s.Lane == lane && s.Name == name {
			return s, true
		}
	}
	return DrawnSpan{}, false
}

// Mark returns the pod's first mark of that name.
func (p DrawnPod) Mark(name string) (DrawnMark, bool) {
	for _, m := range p.Marks {
		if m.Name == name {
			return m, true
		}
	}
	return DrawnMark{}, false
}
