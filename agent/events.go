package agent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
)

// newEvents creates the pod Event recorder when podgate has the Kubernetes API (pods; Events
// are off without it) and a client that writes Events; nil otherwise. Run runs it.
func (a *Agent) newEvents(ctx context.Context, pods *kube.PodLookup) *kube.EventRecorder {
	logger := klog.FromContext(ctx)
	if pods == nil {
		logger.Info("Pod Events off: no kubeconfig")
		return nil
	}
	w, ok := pods.Client().(kube.EventWriter)
	if !ok {
		logger.Info("Pod Events off: the Kubernetes client cannot write Events")
		return nil
	}
	events := kube.NewEventRecorder(w, pods.NodeName(),
		kube.WithEventRate(a.cfg.Events.QPS, a.cfg.Events.Burst), kube.WithEventMetrics(a.registry))
	logger.Info("Pod Events on", "reportingController", kube.ReportingController, "reportingInstance", pods.NodeName(),
		"qps", a.cfg.Events.QPS, "burst", a.cfg.Events.Burst)
	return events
}

// sandboxEvents adapts the recorder to the pipeline's EventFunc.
func sandboxEvents(r *kube.EventRecorder) pipeline.EventFunc {
	return func(pod registry.PodRef, eventType, reason, action, note string) {
		r.Eventf(kube.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, eventType, reason, action, "%s", note)
	}
}
