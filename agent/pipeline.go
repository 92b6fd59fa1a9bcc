package agent

// The pod-sandbox pipeline: the one place that says in which order podgate's features act on
// a pod sandbox. Read this file first; how stages run and undo is package pipeline's.

import (
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
)

// sandboxStages returns the pipeline's stages in order: this list is the order. A feature
// that is off has no stage in it (DRA without the Kubernetes API: dra nil).
func sandboxStages(core *pipeline.Core, sys *sysctl.Stages, dra *draFeature, res *resources.Hooks) []pipeline.Stage {
	stages := []pipeline.Stage{
		sys.CheckStage(), // sysctls: validate the pod's, add the node defaults; may refuse the pod
	}
	if dra != nil {
		stages = append(stages, dra.manager.PrepareStage()) // DRA claims prepared by their drivers: the devices exist before CNI
	}
	stages = append(stages,
		core.Forward(),    // containerd creates the sandbox: network namespace, CNI, pause
		core.Status(),     // the sandbox's verbose status, read once (now, or after the answer)
		sys.VerifyStage(), // sysctls: read back inside the pod; repair, warn or fail
	)
	if dra != nil {
		stages = append(stages, dra.attach.Stage()) // DRA network devices moved into the pod, where configured
	}
	return append(stages,
		res.PodStage(), // the pod-level resources the kubelet sent, for PodResources and resizes
		core.Record(),  // the pod registry and its checkpoint
	)
}
