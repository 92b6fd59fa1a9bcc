package agent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
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
	"github.com/podgate/podgate/test/testfs"
)

// fakeContentStore is containerd's content service holding one image's manifest, its config
// committed and its one layer half written: what ListStatuses, List, Read and Info show while
// containerd pulls it.
type fakeContentStore struct {
	contentapi.UnimplementedContentServer
	manifest []byte
}

const (
	fakeConfigDigest = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	fakeLayerDigest  = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	fakeManifest     = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
)

func (f *fakeContentStore) ListStatuses(context.Context, *contentapi.ListStatusesRequest) (*contentapi.ListStatusesResponse, error) {
	return &contentapi.ListStatusesResponse{Statuses: []*contentapi.Status{
		{Ref: "layer-" + fakeLayerDigest, Offset: 1 << 20, Total: 4 << 20, Expected: fakeLayerDigest},
	}}, nil
}

func (f *fakeContentStore) List(_ *contentapi.ListContentRequest, s contentapi.Content_ListServer) error {
	return s.Send(&contentapi.ListContentResponse{Info: []*contentapi.Info{{
		Digest: fakeManifest, Size: int64(len(f.manifest)), UpdatedAt: timestamppb.Now(),
		Labels: map[string]string{"containerd.io/distribution.source.example.com": "app", "containerd.io/gc.ref.content.config": fakeConfigDigest},
	}}})
}

func (f *fakeContentStore) Read(_ *contentapi.ReadContentRequest, s contentapi.Content_ReadServer) error {
	return s.Send(&contentapi.ReadContentResponse{Data: f.manifest})
}

func (f *fakeContentStore) Info(_ context.Context, req *contentapi.InfoRequest) (*contentapi.InfoResponse, error) {
	if req.GetDigest() == fakeConfigDigest {
		return &contentapi.InfoResponse{Info: &contentapi.Info{Digest: fakeConfigDigest, Size: 1024}}, nil
	}
	return nil, status.Error(codes.NotFound, "not found")
}

// serveImagesAndContent serves the held image service and, on the same socket as containerd
// does, the content service.
func serveImagesAndContent(t *testing.T, dir string) (*heldImages, string) {
	t.Helper()
	h := &heldImages{release: make(chan struct{}), pulling: make(chan string, 10)}
	path := filepath.Join(dir, "images.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterImageServiceServer(s, h)
	contentapi.RegisterContentServer(s, &fakeContentStore{manifest: []byte(fmt.Sprintf(
		`{"schemaVersion":2,"config":{"digest":%q,"size":1024},"layers":[{"digest":%q,"size":%d}]}`, fakeConfigDigest, fakeLayerDigest, 4<<20))})
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

// checkPodPulls asks the extension for the pulls: the running one with its bytes, the waiting
// one held by the node's cap, the sharing one naming the pod it shares with.
func checkPodPulls(t *testing.T, socket string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewPodResourcesClient(conn).PodPulls(t.Context(), &pb.PodPullsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*pb.ImagePull{}
	for _, p := range resp.GetPulls() {
		got[p.GetPodName()] = p
	}
	if p := got["pod-running"]; p.GetState() != pb.ImagePull_PULLING || p.GetBytesDone() != 1<<20+1024 || p.GetBytesTotal() != 4<<20+1024 || p.GetStarted() == nil {
		t.Errorf("running pull: %v", p)
	}
	if p := got["pod-waiting"]; p.GetState() != pb.ImagePull_QUEUED || p.GetPosition() != 1 || p.GetWaitingFor() != "node" || p.GetMaxParallel() != 1 || p.GetInFlight() != 1 {
		t.Errorf("waiting pull: %v", p)
	}
	if p := got["pod-sharing"]; p.GetSharedWith() != "default/pod-waiting" || p.GetImage() != "example.com/other:v1" {
		t.Errorf("sharing pull: %v", p)
	}
	one, err := pb.NewPodResourcesClient(conn).PodPulls(t.Context(), &pb.PodPullsRequest{PodNamespace: "default", PodName: "pod-waiting"})
	if err != nil || len(one.GetPulls()) != 1 || one.GetPulls()[0].GetPodName() != "pod-waiting" {
		t.Errorf("PodPulls of pod-waiting: %v, %v", one, err)
	}
	if _, err := pb.NewPodResourcesClient(conn).PodPulls(t.Context(), &pb.PodPullsRequest{PodNamespace: "default"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("PodPulls with a namespace and no name: %v, want InvalidArgument", err)
	}
}

// TestAgentPullEvents runs the whole agent with a fake API server, a cap of one pull and a
// backend that holds the pulls (and serves containerd's content service beside them): the pod
// whose pull runs gets progress Events with bytes from the content store, the pod that waits
// a queue Event naming the cap and its place, a pod asking for the same image a sharing Event
// naming the pod it shares with, and a pod deleted while queued a cancellation Event. The
// extension's PodPulls shows the same.
func TestAgentPullEvents(t *testing.T) {
	ctx := t.Context()
	dir := testfs.ShortDir(t)
	_, runtimeSock := startFakeRuntime(t, dir)
	images, imageSock := serveImagesAndContent(t, dir)
	running, waiting, sharing, deleted := kubetest.Pod("running", ""), kubetest.Pod("waiting", ""), kubetest.Pod("sharing", ""), kubetest.Pod("deleted", "")
	client := fake.NewClientset(running, waiting, sharing, deleted)

	cfg := testConfig(dir, runtimeSock)
	cfg.ImageEndpoint = "unix://" + imageSock
	cfg.NodeName = "node-a"
	one := int32(1)
	cfg.ImagePulls.MaxParallel = &one
	second := config.Duration{Duration: time.Second}
	cfg.ImagePulls.WaitEventAfter, cfg.ImagePulls.ProgressEventAfter, cfg.ImagePulls.ProgressEventInterval = second, second, second
	runAgentWithAPI(t, cfg, client)
	conn, err := grpc.NewClient("unix://"+cfg.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pulls := runtimeapi.NewImageServiceClient(conn)
	pull := func(pod *corev1.Pod, image string) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := pulls.PullImage(ctx, &runtimeapi.PullImageRequest{
				Image:         &runtimeapi.ImageSpec{Image: image},
				SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}},
			})
			errc <- err
		}()
		return errc
	}

	runningDone := pull(running, "example.com/app:v1")
	if got := <-images.pulling; got != "example.com/app:v1" {
		t.Fatalf("backend pulls %s, want example.com/app:v1", got)
	}
	waitingDone := pull(waiting, "example.com/other:v1")
	awaitEvent(t, client, waiting, imagepull.ReasonPullQueued, `"example.com/other:v1"`, "imagePulls.maxParallel 1, 1 running", "place 1 of 1")
	sharingDone := pull(sharing, "example.com/other:v1")
	awaitEvent(t, client, sharing, imagepull.ReasonPullShared, "pod default/pod-waiting", "waiting in podgate's queue")
	deletedDone := pull(deleted, "example.com/third:v1")
	awaitEvent(t, client, deleted, imagepull.ReasonPullQueued, "place 2 of 2")
	if err := client.CoreV1().Pods(deleted.Namespace).Delete(ctx, deleted.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-deletedDone; status.Code(err) != codes.Aborted {
		t.Errorf("pull of the deleted pod: %v, want Aborted", err)
	}
	awaitEvent(t, client, deleted, imagepull.ReasonPullCancelled, `"example.com/third:v1"`, "never reached the runtime")
	// 1 MiB of the 4 MiB layer written, the 1 KiB config committed.
	awaitEvent(t, client, running, imagepull.ReasonPullProgress, `"example.com/app:v1"`, "1.0 MiB of 4.0 MiB (25%)")
	checkPodPulls(t, *cfg.PodResources.Socket)

	for range 2 {
		images.release <- struct{}{}
	}
	for _, errc := range []<-chan error{runningDone, waitingDone, sharingDone} {
		if err := <-errc; err != nil {
			t.Errorf("pull: %v", err)
		}
	}
	awaitEvent(t, client, running, imagepull.ReasonPullProgress, "Pulled image", "4.0 MiB of 4.0 MiB (100%)")
	for _, p := range []*corev1.Pod{running, waiting, sharing, deleted} {
		for _, e := range podEvents(t, client, p) {
			if e.Series != nil {
				t.Errorf("Event %s: %s has a series: nothing repeated", e.Reason, e.Note)
			}
		}
	}
}
