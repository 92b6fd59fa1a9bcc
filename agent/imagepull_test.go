package agent

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/cri/imagepull"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/testfs"
)

// heldImages is an image service whose pulls wait until the test releases them. It records
// the images it was asked for.
type heldImages struct {
	runtimeapi.UnimplementedImageServiceServer
	release chan struct{}
	mu      sync.Mutex
	asked   []string
	pulling chan string
}

func (h *heldImages) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	image := req.GetImage().GetImage()
	h.mu.Lock()
	h.asked = append(h.asked, image)
	h.mu.Unlock()
	h.pulling <- image
	select {
	case <-h.release:
		return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + image}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (h *heldImages) images() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.asked...)
}

// serveHeldImages serves a heldImages on dir/images.sock until the test ends and, on the same
// socket as containerd does, the content service.
func serveHeldImages(t *testing.T, dir string) (*heldImages, string) {
	t.Helper()
	h := &heldImages{release: make(chan struct{}), pulling: make(chan string, 10)}
	path := filepath.Join(dir, "images.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterImageServiceServer(s, h)
	crifake.RegisterContentStore(s)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
	return h, path
}

// podEvents returns the Events about pod that podgate wrote.
func podEvents(t *testing.T, client *fake.Clientset, pod *corev1.Pod) []eventsv1.Event {
	t.Helper()
	list, err := client.EventsV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.UID == pod.UID {
			out = append(out, e)
		}
	}
	return out
}

// awaitEvent waits for an Event of reason about pod whose note has every one of parts.
func awaitEvent(t *testing.T, client *fake.Clientset, pod *corev1.Pod, reason string, parts ...string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, kubetest.Timeout, true, func(context.Context) (bool, error) {
		for _, e := range podEvents(t, client, pod) {
			if e.Reason != reason {
				continue
			}
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e.Note, p)
			}
			if ok {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var notes []string
		for _, e := range podEvents(t, client, pod) {
			notes = append(notes, e.Reason+": "+e.Note)
		}
		t.Fatalf("no %s Event about %s with %q; it has %q", reason, pod.Name, parts, notes)
	}
	if found.ReportingController != kube.ReportingController || found.ReportingInstance != "node-a" || found.Regarding.Kind != "Pod" {
		t.Errorf("Event %s: reported by %s on %s about a %s", found.Name, found.ReportingController, found.ReportingInstance, found.Regarding.Kind)
	}
	return found
}

// gaugeValue is the value of the gauge name (its first series) in a's registry; -1
// when it is not there.
func gaugeValue(t *testing.T, a *Agent, name string) float64 {
	t.Helper()
	mfs, err := a.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// waitGauge waits until the gauge name in a's registry has the value want.
func waitGauge(t *testing.T, a *Agent, name string, want float64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, kubetest.Timeout, true, func(context.Context) (bool, error) {
		return gaugeValue(t, a, name) == want, nil
	})
	if err != nil {
		t.Fatalf("%s never became %v (last %v): %v", name, want, gaugeValue(t, a, name), err)
	}
}

// checkPodPulls asks the PodResources extension for the pulls of pod: its one pull, queued.
func checkPodPulls(t *testing.T, socket string, pod *corev1.Pod) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewPodResourcesClient(conn).PodPulls(t.Context(), &pb.PodPullsRequest{PodNamespace: pod.Namespace, PodName: pod.Name})
	if err != nil || len(resp.GetPulls()) != 1 || resp.GetPulls()[0].GetState() != pb.ImagePull_QUEUED {
		t.Errorf("PodPulls of %s: %v, %v; want its pull, queued", pod.Name, resp, err)
	}
}

// TestAgentCancelsPullOfDeletedPod runs the whole agent with a fake API server: a pull queued
// behind the cap leaves the queue, Aborted and without reaching the backend, when its pod is
// deleted or marked for deletion. It goes through the agent's own wiring of the image-pull
// feature, so it fails if a part is lost: the pod informer (deletions), the Event recorder
// (the pods' pull Events reach the API server), containerd's content store (progress) and the
// PodResources extension (PodPulls). How the feature acts is cri/imagepull's to test.
func TestAgentCancelsPullOfDeletedPod(t *testing.T) {
	tests := []struct {
		name   string
		delete func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error
	}{
		{"deleted", func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error {
			return client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}},
		{"deletionTimestamp set", func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error {
			pod = pod.DeepCopy()
			now := metav1.Now()
			pod.DeletionTimestamp = &now
			_, err := client.CoreV1().Pods(pod.Namespace).Update(ctx, pod, metav1.UpdateOptions{})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			dir := testfs.ShortDir(t)
			_, runtimeSock := startFakeRuntime(t, dir)
			images, imageSock := serveHeldImages(t, dir)
			pod, blocker := kubetest.Pod("victim", ""), kubetest.Pod("blocker", "")
			client := fake.NewClientset(pod, blocker)

			cfg := testConfig(dir, runtimeSock)
			cfg.ImageEndpoint = "unix://" + imageSock
			cfg.NodeName = "node-a"
			one := int32(1)
			cfg.ImagePulls.MaxParallel = &one
			second := config.Duration{Duration: time.Second}
			cfg.ImagePulls.WaitEventAfter, cfg.ImagePulls.ProgressEventAfter, cfg.ImagePulls.ProgressEventInterval = second, second, second
			a := runAgentWithAPI(t, cfg, client)
			conn, err := grpc.NewClient("unix://"+cfg.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			pulls := runtimeapi.NewImageServiceClient(conn)

			// A blocker holds the only slot until the test ends.
			blocked := make(chan error, 1)
			go func() {
				_, err := pulls.PullImage(ctx, &runtimeapi.PullImageRequest{
					Image:         &runtimeapi.ImageSpec{Image: "example.com/app:v1"},
					SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(blocker.UID), Namespace: blocker.Namespace, Name: blocker.Name}},
				})
				blocked <- err
			}()
			if got := <-images.pulling; got != "example.com/app:v1" {
				t.Fatalf("backend pulls %s first, want the blocker", got)
			}
			victim := make(chan error, 1)
			go func() {
				_, err := pulls.PullImage(ctx, &runtimeapi.PullImageRequest{
					Image:         &runtimeapi.ImageSpec{Image: "example.com/other:v1"},
					SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}},
				})
				victim <- err
			}()
			// The deletion must find the pull queued.
			waitGauge(t, a, "podgate_image_pull_queue_length", 1)
			awaitEvent(t, client, pod, imagepull.ReasonPullQueued, `"example.com/other:v1"`, "place 1 of 1")
			// 1 MiB of the 4 MiB layer written, the 1 KiB config committed.
			awaitEvent(t, client, blocker, imagepull.ReasonPullProgress, `"example.com/app:v1"`, "1.0 MiB of 4.0 MiB (25%)")
			checkPodPulls(t, *cfg.PodResources.Socket, pod)
			if err := tt.delete(ctx, client, pod); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-victim:
				if status.Code(err) != codes.Aborted {
					t.Errorf("pull for the deleted pod = %v, want Aborted", err)
				}
			case <-time.After(kubetest.Timeout):
				t.Fatal("pull for the deleted pod still waits")
			}
			awaitEvent(t, client, pod, imagepull.ReasonPullCancelled, `"example.com/other:v1"`, "never reached the runtime")
			if got := gaugeValue(t, a, "podgate_image_pull_queue_length"); got != 0 {
				t.Errorf("queue holds %v after the deletion, want 0", got)
			}
			close(images.release)
			if err := <-blocked; err != nil {
				t.Errorf("blocker's pull: %v", err)
			}
			if got := images.images(); len(got) != 1 {
				t.Errorf("backend asked for %v, want only the blocker", got)
			}
		})
	}
}
