package agent

// The pod-sandbox pipeline: the one place that says in which order podgate's features act on
// a pod sandbox. Read this file first; how stages run and undo is package pipeline's.

import (
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
)

// sandboxStages returns the pipeline's stages in order. This list is the order.
func sandboxStages(core *pipeline.Core, sys *sysctl.Stages, dra *manager.Manager, att *attach.Attacher, res *resources.Hooks) []pipeline.Stage {
	return []pipeline.Stage{
		sys.CheckStage(),   // sysctls: validate the pod's, add the node defaults; may refuse the pod
		dra.PrepareStage(), // DRA claims prepared by their drivers: the devices exist before CNI
		core.Forward(),     // containerd creates the sandbox: network namespace, CNI, pause
		core.Status(),      // the sandbox's verbose status, read once (now, or after the answer)
		sys.VerifyStage(),  // sysctls: read back inside the pod; repair, warn or fail
		att.Stage(),        // DRA network devices moved into the pod, where configured
		res.PodStage(),     // the pod-level resources the kubelet sent, for PodResources and resizes
		core.Record(),      // the pod registry and its checkpoint
	}
}
