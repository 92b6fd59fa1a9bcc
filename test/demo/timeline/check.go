package timeline

import (
	"fmt"
	"slices"
	"strings"
)

// eps is the rounding of the picture's times (they are written to the microsecond), in ms.
const eps = 0.002

// CheckCall checks, in a picture Read returned, the podgate stages drawn under one kubelet call:
// the podgate rows named in stages are exactly those, drawn in that order, each starting where
// the one before it ended or later, and all inside the call.
func CheckCall(p DrawnPod, call string, stages []string) error {
	c, ok := p.Span(Kubelet, call)
	if !ok {
		return fmt.Errorf("pod %s: no kubelet call %s drawn", p.Name, call)
	}
	var drawn []DrawnSpan
	var names []string
	for _, s := range p.Spans {
		if s.Lane == Podgate && slices.Contains(stages, s.Name) {
			drawn = append(drawn, s)
			names = append(names, s.Name)
		}
	}
	if !slices.Equal(names, stages) {
		return fmt.Errorf("pod %s: podgate's stages of %s drawn as [%s], want [%s]", p.Name, call, strings.Join(names, " "), strings.Join(stages, " "))
	}
	for i, s := range drawn {
		if s.EndMS < s.StartMS {
			return fmt.Errorf("pod %s: stage %s ends (%.3f ms) before it starts (%.3f ms)", p.Name, s.Name, s.EndMS, s.StartMS)
		}
		if s.StartMS < c.StartMS-eps || s.EndMS > c.EndMS+eps {
			return fmt.Errorf("pod %s: stage %s (%.3f..%.3f ms) drawn outside %s (%.3f..%.3f ms)", p.Name, s.Name, s.StartMS, s.EndMS, call, c.StartMS, c.EndMS)
		}
		if i > 0 && s.StartMS < drawn[i-1].EndMS-eps {
			return fmt.Errorf("pod %s: stage %s starts at %.3f ms, before %s ends at %.3f ms", p.Name, s.Name, s.StartMS, drawn[i-1].Name, drawn[i-1].EndMS)
		}
	}
	return nil
}

// CheckPodStart checks a pod start as the demo draws it: RunPodSandbox holding podgate's
// pipeline stages in their order (sandboxStages), PullImage holding the pull's wait in podgate's
// queue and then the pull, the CNI ADD, when marked, inside the forward stage (containerd runs
// CNI), and the driver's prepare, when marked, before the CNI ADD.
func CheckPodStart(p DrawnPod, sandboxStages []string) error {
	if err := CheckCall(p, "RunPodSandbox", sandboxStages); err != nil {
		return err
	}
	if err := CheckCall(p, "PullImage", []string{"pull-wait", "pull"}); err != nil {
		return err
	}
	cni, ok := p.Mark("CNI ADD")
	if !ok {
		return nil
	}
	if fwd, ok := p.Span(Podgate, "forward"); ok && (cni.AtMS < fwd.StartMS || cni.AtMS > fwd.EndMS) {
		return fmt.Errorf("pod %s: CNI ADD at %.3f ms, outside the forward stage (%.3f..%.3f ms)", p.Name, cni.AtMS, fwd.StartMS, fwd.EndMS)
	}
	if prep, ok := p.Mark("driver prepared"); ok && prep.AtMS > cni.AtMS {
		return fmt.Errorf("pod %s: the driver prepared at %.3f ms, after the CNI ADD at %.3f ms", p.Name, prep.AtMS, cni.AtMS)
	}
	return nil
}
