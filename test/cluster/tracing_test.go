//go:build linux

package cluster_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podgate/podgate/test/otlpfake"
)

// TestTraceKubeletToPodgate starts a pod through a real kubelet 1.36 whose tracing is on
// (KubeletConfiguration tracing, every trace sampled), with an OTLP collector of the test's
// (a real gRPC server) receiving the spans: with podgate's tracing on, the kubelet's
// RunPodSandbox span and podgate's are in one trace, podgate's server span a child of the
// kubelet's CRI call and each pipeline stage a child of it; with podgate's tracing off, the
// kubelet's spans come and none of podgate's.
func TestTraceKubeletToPodgate(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("podgate tracing %v", on), func(t *testing.T) {
			collector := otlpfake.Start(t)
			kubelet := map[string]any{"tracing": map[string]any{"endpoint": collector.Endpoint, "samplingRatePerMillion": 1_000_000}}
			podgate := ""
			if on {
				podgate = "tracing:\n  endpoint: " + collector.Endpoint + "\n"
			}
			n := startNodeConfigured(t, true, kubelet, podgate)
			c := n.cluster
			pod := createPod(t, c, testPod("traced", c.NodeName()))
			waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			const method = "runtime.v1.RuntimeService/RunPodSandbox"
			var spans []otlpfake.Span
			var server otlpfake.Span
			// The kubelet and podgate export in batches, every 5 s.
			waitFor(t, 2*time.Minute, "the RunPodSandbox spans", func() (bool, error) {
				spans = collector.Spans()
				kubeletCalls := otlpfake.Find(spans, "kubelet", method)
				if len(kubeletCalls) == 0 {
					return false, fmt.Errorf("%d spans, none of the kubelet's %s", len(spans), method)
				}
				if !on {
					return true, nil
				}
				for _, k := range kubeletCalls {
					for _, s := range otlpfake.Find(spans, "podgate", method) {
						if s.ParentID == k.SpanID && s.TraceID == k.TraceID {
							server = s
							return true, nil
						}
					}
				}
				return false, fmt.Errorf("no podgate %s span under the kubelet's %d", method, len(kubeletCalls))
			})
			if !on {
				for _, s := range spans {
					if s.Service == "podgate" {
						t.Errorf("podgate span %s with podgate's tracing off", s.Name)
					}
				}
				return
			}
			var names []string
			for _, stage := range []string{"sysctl-check", "dra-prepare", "forward", "status", "sysctl-verify", "dra-attach", "record"} {
				found := false
				for _, s := range otlpfake.Find(spans, "podgate", "RunPodSandbox/"+stage) {
					if s.ParentID == server.SpanID && s.TraceID == server.TraceID {
						found = true
						names = append(names, s.Name)
						if s.Attributes["k8s.pod.name"] != pod.Name {
							t.Errorf("span %s: attributes %v", s.Name, s.Attributes)
						}
					}
				}
				if !found {
					t.Errorf("no span of stage %s under podgate's RunPodSandbox", stage)
				}
			}
			t.Logf("trace %s: kubelet %s → podgate %s → %v", server.TraceID, method, method, names)
		})
	}
}
