package agent

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	clientfake "k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/testfs"
)

// The agent's wiring of the sandbox pipeline. How the pipeline runs and undoes its stages is
// cri/pipeline's to test, each stage its feature's.

// hookedRuntime is cri-client's fake runtime with a hook in RunPodSandbox.
type hookedRuntime struct {
	*fake.RemoteRuntime
	onRun func()
}

func (h hookedRuntime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if h.onRun != nil {
		h.onRun()
	}
	return h.RemoteRuntime.RunPodSandbox(ctx, req)
}

// pipelineRig is the agent's stage list (DRA off) in a CRI server in front of cri-client's fake
// runtime (test/crifake), with the state read from a checkpoint and the sysctl node default
// net.ipv4.tcp_keepalive_time=600, so that every sandbox has a sysctl to verify (verify: warn).
type pipelineRig struct {
	proxy    *crifake.Proxy
	registry *registry.Registry
	sysctls  *sysctl.Records
	sys      *sysctl.Stages
	core     *pipeline.Core
}

// newPipelineRig builds the rig; change, when set, alters the stages before they serve.
func newPipelineRig(t *testing.T, change func([]pipeline.Stage)) *pipelineRig {
	t.Helper()
	r := &pipelineRig{proxy: crifake.NewProxy(t, crifake.NewRuntime())}
	stateDir := filepath.Join(r.proxy.Dir, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	st := openTestState(t, stateDir)
	r.registry, r.sysctls = st.Sandboxes, st.Sysctls
	policy, err := sysctlPolicy(&config.Sysctls{PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics := prometheus.NewRegistry()
	r.sys = sysctl.NewStages(policy, sysctl.VerifyWarn, r.sysctls, metrics, sysctl.WithCgroupProcs(cgroupProcs))
	r.core = pipeline.NewCore(r.registry, r.proxy.Server.RuntimeClient(), pipeline.Quiet(r.proxy.Server))
	stages := sandboxStages(r.core, r.sys, nil, testResources(r.registry))
	if change != nil {
		change(stages)
	}
	pipeline.NewRunner(stages, r.registry, metrics).Register(r.proxy.Server)
	cri.Observe(r.proxy.Server, cri.CreateContainer, r.sys.CreateContainer) // as createContainerHooks has it
	r.proxy.Start(t)
	t.Cleanup(func() {
		// Background work ends before the state directory goes.
		for _, wait := range []func(context.Context) error{r.core.Wait, r.sys.Wait} {
			if err := wait(context.Background()); err != nil {
				t.Error(err)
			}
		}
		r.registry.Flush()
	})
	return r
}

// run asks for a sandbox of pod ns/name, as the kubelet does.
func (r *pipelineRig) run(t *testing.T, name string) (string, error) { return r.proxy.RunPod(t, name) }

func podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name},
	}
}

// testResources is the resources feature as the pipeline tests need it: its pod-level stage
// only records, on a node whose cgroups are never read here.
func testResources(reg *registry.Registry) *resources.Hooks {
	return resources.New(resources.Config{}, cgroup.Node{}, reg, nil, prometheus.NewRegistry())
}

// TestSandboxStagesInDocumentedOrder: the agent's stage list is the order docs/architecture.md
// gives ("One pod start"), every stage of it there.
func TestSandboxStagesInDocumentedOrder(t *testing.T) {
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "## One pod start")
	_, block, _ := strings.Cut(section, "```")
	block, _, _ = strings.Cut(block, "```")
	var documented []string
	for _, m := range regexp.MustCompile(`(?m)^\s+\d+\.\s+(\S+)`).FindAllStringSubmatch(block, -1) {
		documented = append(documented, m[1])
	}
	names := stageNames(everyStage(t).stages())
	if !slices.Equal(names, documented) {
		t.Errorf("agent's stages %q, docs/architecture.md's %q", names, documented)
	}
}

// allFeatures are the features that have stages, each on, built for their stages alone.
type allFeatures struct {
	core *pipeline.Core
	sys  *sysctl.Stages
	dra  *draFeature
	res  *resources.Hooks
}

func everyStage(t *testing.T) allFeatures {
	t.Helper()
	st := openTestState(t, t.TempDir())
	policy, err := sysctlPolicy(&config.Sysctls{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics := prometheus.NewRegistry()
	return allFeatures{
		core: pipeline.NewCore(st.Sandboxes, nil, nil),
		sys:  sysctl.NewStages(policy, sysctl.VerifyWarn, st.Sysctls, metrics),
		dra: &draFeature{
			manager: manager.New(rig.NewPods(clientfake.NewClientset()), nil, nil, st.Claims, st.Sandboxes, nil, metrics),
			attach:  attach.New(st.Sandboxes, st.Intents, metrics),
		},
		res: testResources(st.Sandboxes),
	}
}

// stages are the agent's stages with every feature on.
func (f allFeatures) stages() []pipeline.Stage { return sandboxStages(f.core, f.sys, f.dra, f.res) }

// TestDRARigStagesInAgentsOrder: the DRA test rig's stage list (dra/dratest/rig.Stages, which
// dra's tests run, and which cannot import agent) is the agent's with the sysctl and resources
// stages left out: a stage added to the agent's list, or moved in it, fails here until the
// rig's copy follows.
func TestDRARigStagesInAgentsOrder(t *testing.T) {
	f := everyStage(t)
	leftOut := stageNames([]pipeline.Stage{f.sys.CheckStage(), f.sys.VerifyStage(), f.res.PodStage()})
	want := slices.DeleteFunc(stageNames(f.stages()), func(name string) bool { return slices.Contains(leftOut, name) })
	if got := stageNames(rig.Stages(f.core, f.dra.manager, f.dra.attach)); !slices.Equal(got, want) {
		t.Errorf("the DRA rig's stages %q, the agent's without %q: %q", got, leftOut, want)
	}
}

// TestSandboxEventsReachThePod: the agent plugs its Event recorder into the pipeline: a stage
// of podgate's that refuses a sandbox tells the pod so, through the API server.
func TestSandboxEventsReachThePod(t *testing.T) {
	dir := testfs.ShortDir(t)
	_, backend := startFakeRuntime(t, dir)
	pod := kubetest.Pod("refused", "")
	client := clientfake.NewClientset(pod)
	cfg := testConfig(dir, backend)
	cfg.NodeName = "node-a"
	runAgentWithAPI(t, cfg, client)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"kernel.core_pattern": "core"}},
	}
	_, err := criClient(t, cfg.CRISocket).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sb}, grpc.WaitForReady(true))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("RunPodSandbox = %v, want InvalidArgument", err)
	}
	e := awaitEvent(t, client, pod, "FailedSysctlCheck", `stage "sysctl-check" refused the pod sandbox`, "kernel.core_pattern")
	if e.Type != corev1.EventTypeWarning || e.Action != "RunPodSandbox" {
		t.Errorf("Event %s: type %s, action %s", e.Reason, e.Type, e.Action)
	}
}
