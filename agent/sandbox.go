package agent

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
)

// sandboxLog writes one log line per pod sandbox start, stop and removal, naming the pod, so an
// operator can follow a pod's life through podgate without raising the log level. Later features
// (sysctls, DRA) hang off the same interception points.
type sandboxLog struct{}

func (sandboxLog) register(s *cri.Server) {
	cri.Intercept(s, cri.RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
		md := req.GetConfig().GetMetadata()
		logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()), "podUID", md.GetUid())
		start := time.Now()
		resp, err := next(ctx, req)
		if err != nil {
			logger.Info("Pod sandbox failed", "err", err, "duration", time.Since(start))
			return nil, err
		}
		logger.Info("Pod sandbox started", "podSandboxID", resp.GetPodSandboxId(), "runtimeHandler", req.GetRuntimeHandler(), "duration", time.Since(start))
		return resp, nil
	})
	cri.Intercept(s, cri.StopPodSandbox, func(ctx context.Context, req *runtimeapi.StopPodSandboxRequest, next cri.Forward[*runtimeapi.StopPodSandboxRequest, *runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
		resp, err := next(ctx, req)
		if err == nil {
			klog.FromContext(ctx).Info("Pod sandbox stopped", "podSandboxID", req.GetPodSandboxId())
		}
		return resp, err
	})
	cri.Intercept(s, cri.RemovePodSandbox, func(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next cri.Forward[*runtimeapi.RemovePodSandboxRequest, *runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
		resp, err := next(ctx, req)
		if err == nil {
			klog.FromContext(ctx).Info("Pod sandbox removed", "podSandboxID", req.GetPodSandboxId())
		}
		return resp, err
	})
}
