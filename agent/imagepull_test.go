package agent

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/kube/kubetest"
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

// serveHeldImages serves a heldImages on dir/images.sock until the test ends.
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
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
	return h, path
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

// TestAgentCancelsPullOfDeletedPod runs the whole agent with a fake API server: a pull queued
// behind the cap leaves the queue, Aborted and without reaching the backend, when its pod is
// deleted or marked for deletion. It goes through the agent's own wiring of the pod informer
// to the pull governor, so it fails if that wiring is lost.
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
			pod := kubetest.Pod("victim", "")
			client := fake.NewClientset(pod)

			cfg := testConfig(dir, runtimeSock)
			cfg.ImageEndpoint = "unix://" + imageSock
			cfg.NodeName = "node-a"
			one := int32(1)
			cfg.ImagePulls.MaxParallel = &one
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
				_, err := pulls.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "example.com/blocker"}})
				blocked <- err
			}()
			if got := <-images.pulling; got != "example.com/blocker" {
				t.Fatalf("backend pulls %s first, want the blocker", got)
			}
			victim := make(chan error, 1)
			go func() {
				_, err := pulls.PullImage(ctx, &runtimeapi.PullImageRequest{
					Image:         &runtimeapi.ImageSpec{Image: "example.com/app"},
					SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}},
				})
				victim <- err
			}()
			// The deletion must find the pull queued.
			waitGauge(t, a, "podgate_image_pull_queue_length", 1)
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
