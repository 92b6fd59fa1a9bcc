package agent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
)

// startEvents creates the pod Event recorder when podgate has the Kubernetes API (Events are
// off without it) and a client that writes Events. Run runs it.
func (a *Agent) startEvents(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if a.pods == nil {
		logger.Info("Pod Events off: no kubeconfig")
		return
	}
	w, ok := a.pods.Client().(kube.EventWriter)
	if !ok {
		logger.Info("Pod Events off: the Kubernetes client cannot write Events")
		return
	}
	a.events = kube.NewEventRecorder(w, a.pods.NodeName(),
		kube.WithEventRate(a.cfg.Events.QPS, a.cfg.Events.Burst), kube.WithEventMetrics(a.registry))
	logger.Info("Pod Events on", "reportingController", kube.ReportingController, "reportingInstance", a.pods.NodeName(),
		"qps", a.cfg.Events.QPS, "burst", a.cfg.Events.Burst)
}

// sandboxEvents adapts the recorder to the pipeline's EventFunc.
func sandboxEvents(r *kube.EventRecorder) pipeline.EventFunc {
	return func(pod registry.PodRef, eventType, reason, action, note string) {
		r.Eventf(kube.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, eventType, reason, action, "%s", note)
	}
}
