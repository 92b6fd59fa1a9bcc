package rig

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/kubefake"
	"github.com/podgate/podgate/test/testfs"
)

// waitTimeout bounds the waits for the driver's registration and for one pod start.
const waitTimeout = 30 * time.Second

// Options vary the rig.
type Options struct {
	// CallTimeout bounds each driver call.
	CallTimeout time.Duration
	// Objects are what the API server holds: pods (in the informer from the start), claims,
	// ResourceSlices.
	Objects []runtime.Object
	// Manager returns more options of the manager, given the rig built so far (its API server,
	// driver and claim resolver).
	Manager func(r *Rig) []manager.Option
	// Attach returns the attacher's options; nil: dra.attach empty.
	Attach func(r *Rig) []attach.Option
	// NetNS, when set, is the network namespace of every sandbox in the runtime's verbose
	// status, as containerd reports it.
	NetNS string
}

// Rig is the DRA feature in podgate's sandbox pipeline, its stages those of dra.prepare and
// dra.attach beside the pipeline's own (Stages).
type Rig struct {
	// Dir holds the sockets and StateDir the checkpoint.
	Dir, StateDir string
	// Runtime is the fake runtime; RuntimeClient talks to it past podgate, Client through
	// podgate's CRI server.
	Runtime       *fake.RemoteRuntime
	RuntimeClient runtimeapi.RuntimeServiceClient
	Client        runtimeapi.RuntimeServiceClient
	// Kube is the fake API server, Pods the node's pods over it.
	Kube *k8sfake.Clientset
	Pods *Pods
	// Driver is the fake driver, registered in Drivers.
	Driver  *dratest.Driver
	Drivers *dra.Drivers
	Claims  *dra.ClaimResolver
	// HostIfs, when a test's options make it, finds the devices' host interfaces.
	HostIfs *dra.HostInterfaces
	// Registry is the pod registry with the feature's sections, ClaimStore and Intents.
	Registry   *registry.Registry
	ClaimStore *manager.Claims
	Intents    *attach.Intents
	Core       *pipeline.Core
	Manager    *manager.Manager
	Attacher   *attach.Attacher
	Metrics    *prometheus.Registry

	// gets counts the API server's GETs (pods and claims); atRun is the driver's calls when
	// the runtime's RunPodSandbox began.
	gets  atomic.Int32
	atRun atomic.Pointer[[]string]
}

// New builds the rig; everything it runs ends with the test.
func New(t testing.TB, o Options) *Rig {
	t.Helper()
	dir := testfs.ShortDir(t)
	r := &Rig{Dir: dir, StateDir: filepath.Join(dir, "state"), Metrics: prometheus.NewRegistry(), Kube: k8sfake.NewClientset(o.Objects...)}
	r.Kube.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		r.gets.Add(1)
		return false, nil, nil
	})
	var pods []*corev1.Pod
	for _, obj := range o.Objects {
		if p, ok := obj.(*corev1.Pod); ok {
			pods = append(pods, p)
		}
	}
	r.Pods = NewPods(r.Kube, pods...)
	for _, d := range []string{r.StateDir, filepath.Join(dir, "reg"), filepath.Join(dir, "plug")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r.startDriver(t, o.CallTimeout)
	r.Claims = dra.NewClaimResolver(kubefake.Wrap(r.Kube), nil)
	r.Registry, r.ClaimStore, r.Intents = ReadState(t, r.StateDir)

	r.Runtime = fake.NewFakeRemoteRuntime()
	rtPath := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: r.Runtime, onRun: r.noteRun, netns: o.NetNS})
	backend, err := cri.NewBackend(t.Context(), "runtime", rtPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	srv := cri.NewServer(backend, backend)
	r.RuntimeClient = srv.RuntimeClient()

	var aopts []attach.Option
	if o.Attach != nil {
		aopts = o.Attach(r)
	}
	r.Attacher = attach.New(r.Registry, r.Intents, r.Metrics, aopts...)
	var mopts []manager.Option
	if o.Manager != nil {
		mopts = o.Manager(r)
	}
	r.Manager = manager.New(r.Pods, r.Drivers, r.Claims, r.ClaimStore, r.Registry, r.RuntimeClient, r.Metrics, mopts...)
	r.Core = pipeline.NewCore(r.Registry, r.RuntimeClient, pipeline.Quiet(srv))
	pipeline.NewRunner(Stages(r.Core, r.Manager, r.Attacher), r.Registry, r.Metrics).Register(srv)

	l, err := cri.Listen(filepath.Join(dir, "pg.sock"), cri.SocketOptions{Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l) //nolint:errcheck // returns nil after Shutdown
	t.Cleanup(func() {
		srv.Shutdown(context.Background())
		// Background work ends before the state directory goes.
		if err := r.Core.Wait(context.Background()); err != nil {
			t.Error(err)
		}
	})
	r.Client = criClient(t, filepath.Join(dir, "pg.sock"))
	return r
}

// Stages are the sandbox pipeline's stages with the DRA feature's, in the agent's order (its
// sysctl and resources stages left out): prepare before the sandbox is created, attach once it
// runs, before its record. A copy, since nothing outside agent/ imports agent: agent's
// TestDRARigStagesInAgentsOrder fails when it and agent's sandboxStages part.
func Stages(core *pipeline.Core, m *manager.Manager, at *attach.Attacher) []pipeline.Stage {
	return []pipeline.Stage{m.PrepareStage(), core.Forward(), core.Status(), at.Stage(), core.Record()}
}

// startDriver starts the fake driver in the rig's plugin registry and waits until Drivers
// knows it.
func (r *Rig) startDriver(t testing.TB, callTimeout time.Duration) {
	t.Helper()
	regDir := filepath.Join(r.Dir, "reg")
	r.Driver = dratest.Start(t, regDir, filepath.Join(r.Dir, "plug"), Driver)
	r.Drivers = dra.NewDrivers(dra.WithPluginRegistryDir(regDir), dra.WithCallTimeout(callTimeout))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Drivers.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; r.Drivers.Close() })
	wctx, wcancel := context.WithTimeout(ctx, waitTimeout)
	defer wcancel()
	if _, err := r.Drivers.WaitFor(wctx, Driver); err != nil {
		t.Fatal(err)
	}
}

func (r *Rig) noteRun() {
	calls := r.Driver.Calls()
	r.atRun.Store(&calls)
}

// Gets is the number of GETs the API server answered (pods and claims).
func (r *Rig) Gets() int32 { return r.gets.Load() }

// AtRun is the driver's calls when the runtime got the last RunPodSandbox; nil: none reached
// it.
func (r *Rig) AtRun() *[]string { return r.atRun.Load() }

// RunPod starts a sandbox of pod through podgate, as the kubelet does.
func (r *Rig) RunPod(t testing.TB, pod *corev1.Pod) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	resp, err := r.Client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Labels:   map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	}})
	return resp.GetPodSandboxId(), err
}

// RemoveSandbox stops and removes a sandbox through podgate, as the kubelet does.
func (r *Rig) RemoveSandbox(t testing.TB, id string) {
	t.Helper()
	if _, err := r.Client.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Client.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
}

// DeletePod deletes pod from the API server and the informer.
func (r *Rig) DeletePod(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	if err := r.Pods.Delete(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
}

// RuntimeSandboxes is what the fake runtime holds, read past podgate.
func (r *Rig) RuntimeSandboxes(t testing.TB) []*runtimeapi.PodSandbox {
	t.Helper()
	items, err := r.Runtime.RuntimeService.ListPodSandbox(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// hookedRuntime is cri-client's fake runtime with a hook in RunPodSandbox and, optionally, a
// network namespace in its verbose sandbox status.
type hookedRuntime struct {
	*fake.RemoteRuntime
	onRun func()
	netns string
}

func (h hookedRuntime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	resp, err := h.RemoteRuntime.PodSandboxStatus(ctx, req)
	if err != nil || h.netns == "" {
		return resp, err
	}
	info, err := json.Marshal(map[string]any{"runtimeSpec": map[string]any{"linux": map[string]any{
		"namespaces": []map[string]string{{"type": "network", "path": h.netns}},
	}}})
	if err != nil {
		return nil, err
	}
	resp.Info = map[string]string{"info": string(info)}
	return resp, nil
}

func (h hookedRuntime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	h.onRun()
	return h.RemoteRuntime.RunPodSandbox(ctx, req)
}

// serveRuntime serves rt as a CRI runtime on a unix socket in dir and returns its path.
func serveRuntime(t testing.TB, dir string, rt runtimeapi.RuntimeServiceServer) string {
	t.Helper()
	path := filepath.Join(dir, "rt.sock")
	crifake.Serve(t, path, rt)
	return path
}

func criClient(t testing.TB, socket string) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}
