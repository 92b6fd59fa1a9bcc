package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

// TestPodLifecycleThroughPodgate drives one pod through podgate the way the kubelet does, from
// RunPodSandbox to RemovePodSandbox, and checks each answer against containerd's own.
func TestPodLifecycleThroughPodgate(t *testing.T) {
	n := startNode(t)
	ctx := t.Context()
	kubelet := n.through

	v, err := kubelet.Runtime.Version(ctx, "v1")
	if err != nil {
		t.Fatalf("Version: %v", err)
	}
	if v.RuntimeName != "containerd" || v.RuntimeApiVersion != "v1" {
		t.Errorf("Version through podgate = %v, want containerd's", v)
	}
	st, err := kubelet.Runtime.Status(ctx, false)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	// The kubelet requires these two; containerd adds others (a cgroup v1 deprecation here).
	ready := map[string]bool{}
	for _, c := range st.GetStatus().GetConditions() {
		ready[c.Type] = c.Status
	}
	if !ready[runtimeapi.RuntimeReady] || !ready[runtimeapi.NetworkReady] {
		t.Errorf("runtime conditions %v, want RuntimeReady and NetworkReady true", st.GetStatus().GetConditions())
	}

	// Watch container events from before the container exists, as the kubelet's evented PLEG does.
	events := make(chan *runtimeapi.ContainerEventResponse, 64)
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	streamOpen := make(chan struct{})
	go func() {
		_ = kubelet.Runtime.GetContainerEvents(evCtx, events, func(runtimeapi.RuntimeService_GetContainerEventsClient) { close(streamOpen) })
	}()
	<-streamOpen

	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "e2e", Uid: "uid-web-1"},
		Hostname:     "web",
		LogDirectory: filepath.Join(n.rig.Dir, "pods", "web"),
		Labels:       map[string]string{"app": "web"},
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	podID, err := kubelet.Runtime.RunPodSandbox(ctx, sbCfg, "")
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	podStatus, err := kubelet.Runtime.PodSandboxStatus(ctx, podID, false)
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	ip, err := netip.ParseAddr(podStatus.GetStatus().GetNetwork().GetIp())
	if err != nil || !n.rig.Subnet.Contains(ip) {
		t.Fatalf("pod IP %q (%v), want an address in the CNI subnet %s", podStatus.GetStatus().GetNetwork().GetIp(), err, n.rig.Subnet)
	}
	t.Logf("pod %s has IP %s", podID, ip)

	ctrID, err := kubelet.Runtime.CreateContainer(ctx, podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "echo started-through-podgate; exec sleep 3600"},
		LogPath:  "app/0.log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}, sbCfg)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if err := kubelet.Runtime.StartContainer(ctx, ctrID); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	waitEvent(t, events, ctrID, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	waitEvent(t, events, ctrID, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)

	stdout, stderr, err := kubelet.Runtime.ExecSync(ctx, ctrID, []string{"/bin/sh", "-c", "echo exec-ok; hostname"}, 10*time.Second)
	if err != nil {
		t.Fatalf("ExecSync: %v (stderr %q)", err, stderr)
	}
	if got := string(stdout); got != "exec-ok\nweb\n" {
		t.Errorf("ExecSync stdout %q, want exec-ok and the pod's hostname", got)
	}
	cs, err := kubelet.Runtime.ContainerStatus(ctx, ctrID, false)
	if err != nil {
		t.Fatalf("ContainerStatus: %v", err)
	}
	if cs.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container state %v, want running", cs.GetStatus().GetState())
	}
	logPath := filepath.Join(sbCfg.LogDirectory, "app", "0.log")
	waitFileContains(t, logPath, "started-through-podgate")

	// Passthrough answers equal containerd's own, call for call.
	samePassthrough(t, n, podID, ctrID)

	if err := kubelet.Runtime.StopContainer(ctx, ctrID, 5); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	waitEvent(t, events, ctrID, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	if err := kubelet.Runtime.RemoveContainer(ctx, ctrID); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	waitEvent(t, events, ctrID, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	if err := kubelet.Runtime.StopPodSandbox(ctx, podID); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if err := kubelet.Runtime.RemovePodSandbox(ctx, podID); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	// Stop and Remove are idempotent, through podgate as with containerd.
	if err := kubelet.Runtime.RemovePodSandbox(ctx, podID); err != nil {
		t.Errorf("second RemovePodSandbox: %v", err)
	}
	pods, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 0 {
		t.Errorf("containerd still has %d sandboxes", len(pods))
	}

	// podgate logged the pod's life and counted the calls.
	for _, line := range []string{`"Pod sandbox started" pod="e2e/web"`, `"Pod sandbox removed" podSandboxID="` + podID} {
		if !strings.Contains(n.podgate.Log.String(), line) {
			t.Errorf("podgate log lacks %s", line)
		}
	}
	metrics, err := n.podgate.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{
		`podgate_cri_requests_total{code="OK",method="RunPodSandbox"} 1`,
		`podgate_cri_requests_total{code="OK",method="ExecSync"} 1`,
		`podgate_cri_backend_up{backend="runtime",endpoint="` + n.rig.Endpoint + `"} 1`,
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

// samePassthrough compares the answers of read-only calls through podgate with containerd's.
func samePassthrough(t *testing.T, n *node, podID, ctrID string) {
	t.Helper()
	ctx := t.Context()
	type call struct {
		name string
		do   func(c *rig.Client) (proto.Message, error)
	}
	calls := []call{
		{"Version", func(c *rig.Client) (proto.Message, error) { return c.Runtime.Version(ctx, "v1") }},
		{"PodSandboxStatus", func(c *rig.Client) (proto.Message, error) { return c.Runtime.PodSandboxStatus(ctx, podID, false) }},
		{"ContainerStatus", func(c *rig.Client) (proto.Message, error) { return c.Runtime.ContainerStatus(ctx, ctrID, false) }},
		{"ListPodSandbox", func(c *rig.Client) (proto.Message, error) {
			l, err := c.Runtime.ListPodSandbox(ctx, nil)
			return &runtimeapi.ListPodSandboxResponse{Items: l}, err
		}},
		{"ListContainers", func(c *rig.Client) (proto.Message, error) {
			l, err := c.Runtime.ListContainers(ctx, nil)
			return &runtimeapi.ListContainersResponse{Containers: l}, err
		}},
		{"ListImages", func(c *rig.Client) (proto.Message, error) {
			l, err := c.Images.ListImages(ctx, nil)
			// containerd lists images in map order: compare them sorted.
			slices.SortFunc(l, func(a, b *runtimeapi.Image) int { return strings.Compare(a.Id, b.Id) })
			return &runtimeapi.ListImagesResponse{Images: l}, err
		}},
		{"ImageStatus", func(c *rig.Client) (proto.Message, error) {
			return c.Images.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: rig.BusyboxImage}, false)
		}},
	}
	for _, c := range calls {
		direct, err := c.do(n.direct)
		if err != nil {
			t.Fatalf("%s direct: %v", c.name, err)
		}
		through, err := c.do(n.through)
		if err != nil {
			t.Fatalf("%s through podgate: %v", c.name, err)
		}
		if !proto.Equal(direct, through) {
			t.Errorf("%s through podgate differs from containerd's:\n direct  %v\n through %v", c.name, direct, through)
		}
	}
	// The lists name the pod and the container, so the comparison above compared something.
	l, err := n.through.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: podID})
	if err != nil || len(l) != 1 || l[0].Id != ctrID {
		t.Errorf("ListContainers for the pod = %v, %v; want the one container", l, err)
	}
	img, err := n.through.Images.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: rig.BusyboxImage}, false)
	if err != nil || img.GetImage() == nil {
		t.Errorf("ImageStatus %s through podgate = %v, %v", rig.BusyboxImage, img, err)
	}
}

func waitEvent(t *testing.T, events <-chan *runtimeapi.ContainerEventResponse, id string, typ runtimeapi.ContainerEventType) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.ContainerId == id && ev.ContainerEventType == typ {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for container %s within 30s", typ, id)
		}
	}
}

// waitFileContains polls a container log file: containerd writes it asynchronously.
func waitFileContains(t *testing.T, path, want string) {
	t.Helper()
	var b []byte
	var err error
	if werr := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		b, err = os.ReadFile(path)
		return err == nil && strings.Contains(string(b), want), nil
	}); werr != nil {
		t.Fatalf("log %s does not contain %q within 30s (read: %q, %v)", path, want, b, err)
	}
}
