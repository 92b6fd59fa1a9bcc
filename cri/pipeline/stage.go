package pipeline

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/registry"
)

// Stage is one step of the pod-sandbox pipeline. Only Run is required.
type Stage struct {
	// Name names the stage in metrics (stage label), spans ("RunPodSandbox/<name>") and logs.
	Name string
	// Run does the stage's work for a RunPodSandbox. When it fails it leaves nothing of its
	// own behind: the pipeline undoes only the stages that succeeded.
	Run func(ctx context.Context, sb *Sandbox) error
	// Undo reverses a successful Run when a later stage fails.
	Undo func(ctx context.Context, sb *Sandbox) error
	// Stop runs before StopPodSandbox is forwarded, for a sandbox the registry knows.
	Stop func(ctx context.Context, rec registry.SandboxRecord) error
	// Removed runs once the runtime has removed the sandbox (or says it has none by that ID).
	Removed func(ctx context.Context, id string) error
	// Holds, for a stage of podgate's that may hold a sandbox for long, says what it does
	// then: the pod is told so in a SandboxHeld Event ("the DRA drivers prepare the pod's
	// claims"). Empty: the stage is never reported as holding the sandbox.
	Holds string
	// RefusedReason is the Event reason when this stage refuses the sandbox
	// ("FailedSysctlCheck"). Empty: its failures are the kubelet's to report (the runtime's).
	RefusedReason string
}

// Sandbox is one RunPodSandbox call on its way through the stages.
type Sandbox struct {
	// Req is what is forwarded. A stage that changes it replaces it with a changed copy: the
	// CRI proxy forwards the kubelet's own bytes when Req is left as it came.
	Req *runtimeapi.RunPodSandboxRequest
	// Resp is the runtime's answer, once the forward stage has run.
	Resp *runtimeapi.RunPodSandboxResponse
	// Rec is the sandbox's registry record as the stages build it.
	Rec    registry.SandboxRecord
	Logger klog.Logger

	next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]
	// answered holds work that starts once RunPodSandbox has succeeded, just before the
	// kubelet gets the answer (a background verification).
	answered []func()
	// ended holds what runs when the call ends, whether it succeeded or not.
	ended []func()
	// runtimeView reads the sandbox's verbose status once (later calls return the first
	// answer): its netns, pause PID, IPs, and the runtime's error when it did not answer, with
	// its class. Set by the status stage.
	runtimeView func() (registry.SandboxRecord, error)
}

// NewSandbox starts a RunPodSandbox call's way through the stages: req as the kubelet sent
// it, next the call's way to the runtime.
func NewSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) *Sandbox {
	md := req.GetConfig().GetMetadata()
	return &Sandbox{
		Req:  req,
		next: next,
		Rec: registry.SandboxRecord{
			Pod:            registry.PodRef{UID: types.UID(md.GetUid()), Name: md.GetName(), Namespace: md.GetNamespace(), Attempt: md.GetAttempt()},
			RuntimeHandler: req.GetRuntimeHandler(),
			Origin:         registry.OriginStarted,
			CgroupParent:   req.GetConfig().GetLinux().GetCgroupParent(),
			CreatedAt:      time.Now().UTC(),
		},
		Logger: klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()),
			"podUID", md.GetUid()),
	}
}

// FromRuntime fills Rec with the sandbox's status now, for a stage that needs the sandbox's
// namespaces before RunPodSandbox answers. The error is the runtime's, class kept.
func (sb *Sandbox) FromRuntime() error {
	if sb.runtimeView == nil {
		return nil
	}
	v, err := sb.runtimeView()
	sb.Rec.FillFromRuntime(&v)
	return err
}

// RuntimeView is the once-only read of the sandbox's verbose status the status stage set up
// (nil before it ran), for work that reads it after the answer.
func (sb *Sandbox) RuntimeView() func() (registry.SandboxRecord, error) { return sb.runtimeView }

// OnAnswer adds fn to what runs once every stage has succeeded.
func (sb *Sandbox) OnAnswer(fn func()) { sb.answered = append(sb.answered, fn) }

// OnEnd adds fn to what runs when the call ends, after the answer's work or the rollback.
func (sb *Sandbox) OnEnd(fn func()) { sb.ended = append(sb.ended, fn) }

// End runs what the stages added with OnEnd. The Runner calls it when the call ends; a
// benchmark or test that runs a stage on its own calls it too.
func (sb *Sandbox) End() {
	for _, fn := range sb.ended {
		fn()
	}
}
