//go:build linux

package cluster_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/rig"
)

// TestTraceKubeletToPodgate starts a pod through a real kubelet 1.36 whose tracing is on
// (KubeletConfiguration tracing, every trace sampled) and a containerd tracing too (its OTEL_*
// environment), with an OTLP collector of the test's (a real gRPC server) receiving the spans:
// with podgate's tracing on, one trace holds kubelet → podgate → containerd: podgate's server
// span a child of the kubelet's CRI call, each pipeline stage a child of it, and containerd's
// RunPodSandbox (with CNI and the task under it) a child of podgate's call from the forward
// stage; with podgate's tracing off, none of podgate's spans, and containerd's a child of the
// kubelet's call, whose trace context podgate passed on untouched.
func TestTraceKubeletToPodgate(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("podgate tracing %v", on), func(t *testing.T) {
			collector := otlpfake.Start(t)
			kubelet := map[string]any{"tracing": map[string]any{"endpoint": collector.Endpoint, "samplingRatePerMillion": 1_000_000}}
			podgate := ""
			if on {
				podgate = "tracing:\n  endpoint: " + collector.Endpoint + "\n"
			}
			n := startNodeConfigured(t, true, kubelet, podgate, rig.Options{OTLPEndpoint: collector.Endpoint})
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
				// podgate passes the kubelet's trace context on untouched: containerd's span is
				// the kubelet's call's child.
				waitFor(t, time.Minute, "containerd's RunPodSandbox span under the kubelet's", func() (bool, error) {
					spans = collector.Spans()
					for _, k := range otlpfake.Find(spans, "kubelet", method) {
						for _, s := range otlpfake.Find(spans, "containerd", method) {
							if s.ParentID == k.SpanID && s.TraceID == k.TraceID {
								return true, nil
							}
						}
					}
					return false, fmt.Errorf("%d containerd spans", len(otlpfake.Find(spans, "containerd", method)))
				})
				return
			}
			var names []string
			var forward otlpfake.Span
			for _, stage := range []string{"sysctl-check", "dra-prepare", "forward", "status", "sysctl-verify", "dra-attach", "record"} {
				found := false
				for _, s := range otlpfake.Find(spans, "podgate", "RunPodSandbox/"+stage) {
					if s.ParentID == server.SpanID && s.TraceID == server.TraceID {
						found = true
						names = append(names, s.Name)
						if stage == "forward" {
							forward = s
						}
						if s.Attributes["k8s.pod.name"] != pod.Name {
							t.Errorf("span %s: attributes %v", s.Name, s.Attributes)
						}
					}
				}
				if !found {
					t.Errorf("no span of stage %s under podgate's RunPodSandbox", stage)
				}
			}
			// containerd's server span of the call podgate forwarded, under podgate's client span.
			var client, runtime otlpfake.Span
			waitFor(t, time.Minute, "containerd's RunPodSandbox span under podgate's", func() (bool, error) {
				spans = collector.Spans()
				for _, c := range otlpfake.Find(spans, "podgate", method) {
					if c.ParentID != forward.SpanID {
						continue
					}
					for _, s := range otlpfake.Find(spans, "containerd", method) {
						if s.ParentID == c.SpanID && s.TraceID == server.TraceID {
							client, runtime = c, s
							return true, nil
						}
					}
				}
				return false, fmt.Errorf("%d containerd spans", len(otlpfake.Find(spans, "containerd", method)))
			})
			var below []string
			for _, s := range spans {
				if s.TraceID == server.TraceID && s.Service == "containerd" {
					below = append(below, s.Name)
				}
			}
			t.Logf("trace %s: kubelet %s → podgate %s → %v; forward → podgate client %s → containerd %s (%d containerd spans in the trace: %v)",
				server.TraceID, method, method, names, client.SpanID, runtime.SpanID, len(below), below)
		})
	}
}
